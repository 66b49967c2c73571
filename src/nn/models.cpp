#include <minigrad/nn/models.h>

namespace mg::nn {

std::shared_ptr<Sequential> make_mlp(const std::vector<int64_t>& sizes) {
  MG_CHECK(sizes.size() >= 2, "make_mlp: need at least input and output sizes, got " << sizes.size());
  auto m = std::make_shared<Sequential>();
  m->add<Flatten>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    m->add<Linear>(sizes[i], sizes[i + 1]);
    if (i + 2 < sizes.size()) m->add<ReLU>();
  }
  return m;
}

std::shared_ptr<Sequential> make_vgg16(int64_t num_classes, int64_t width_div, float dropout_p) {
  MG_CHECK(width_div >= 1, "make_vgg16: width_div must be >= 1, got " << width_div);
  MG_CHECK(num_classes >= 1, "make_vgg16: num_classes must be >= 1, got " << num_classes);
  const int64_t kPool = -1;
  const std::vector<int64_t> cfg = {64, 64, kPool, 128, 128, kPool, 256, 256, 256, kPool,
                                    512, 512, 512, kPool, 512, 512, 512, kPool};
  auto m = std::make_shared<Sequential>();
  int64_t in = 3;
  for (int64_t c : cfg) {
    if (c == kPool) {
      m->add<MaxPool2d>(2, 2);
      continue;
    }
    const int64_t out = std::max<int64_t>(1, c / width_div);
    m->add<Conv2d>(in, out, 3, 1, 1);
    m->add<ReLU>();
    in = out;
  }
  const int64_t hidden = std::max<int64_t>(1, 4096 / width_div);
  m->add<AdaptiveAvgPool2d>(7, 7);
  m->add<Flatten>();
  m->add<Linear>(in * 7 * 7, hidden);
  m->add<ReLU>();
  m->add<Dropout>(dropout_p);
  m->add<Linear>(hidden, hidden);
  m->add<ReLU>();
  m->add<Dropout>(dropout_p);
  m->add<Linear>(hidden, num_classes);
  return m;
}

}  // namespace mg::nn
