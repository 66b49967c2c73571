#include "kernels/linear.h"

#include "kernels/cpu/eigen.h"

namespace mg {

template <> void linear_forward<Cpu>(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  auto Y = cpu::mat(y, n, m);
  Y.noalias() = cpu::cmat(x, n, k) * cpu::cmat(w, m, k).transpose();
  if (b.defined()) Y.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b.data<float>(), m);
}

template <>
void linear_backward<Cpu>(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x,
                          const Tensor& w, bool accumulate) {
  const int64_t n = x.size(0), k = x.size(1), m = w.size(0);
  auto DY = cpu::cmat(dy, n, m);
  if (dx.defined()) cpu::mat(dx, n, k).noalias() = DY * cpu::cmat(w, m, k);
  if (dw.defined()) {
    auto DW = cpu::mat(dw, m, k);
    if (accumulate) DW.noalias() += DY.transpose() * cpu::cmat(x, n, k);
    else DW.noalias() = DY.transpose() * cpu::cmat(x, n, k);
  }
  if (db.defined()) {
    auto DB = cpu::mat(db, 1, m);
    if (accumulate) DB += DY.colwise().sum();
    else DB = DY.colwise().sum();
  }
}

}  // namespace mg
