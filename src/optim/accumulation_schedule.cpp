// The accumulation schedule ("epoch:N,..."), and the linear learning-rate scaling that goes with
// a change of the effective batch.
#include <minigrad/optim/accumulate.h>

#include <cctype>
#include <sstream>

#include <minigrad/core/error.h>

namespace mg::optim {

AccumulationSchedule::AccumulationSchedule(int64_t fixed) {
  MG_CHECK(fixed >= 1, "accumulation schedule: N must be >= 1, got " << fixed);
  table_[0] = fixed;
}

namespace {

int64_t parse_int(const std::string& s, const std::string& spec, const char* what) {
  std::string t;
  for (char c : s) if (c != ' ') t += c;
  MG_CHECK(!t.empty(), "accumulation schedule \"" << spec << "\": empty " << what
                                                  << " (expected \"epoch:N,epoch:N\", e.g. \"0:8,4:2\")");
  for (char c : t) {
    MG_CHECK(std::isdigit(static_cast<unsigned char>(c)),
             "accumulation schedule \"" << spec << "\": " << what << " \"" << t
                                        << "\" is not a non-negative integer (expected \"epoch:N,...\", e.g. \"0:8,4:2\")");
  }
  MG_CHECK(t.size() <= 9, "accumulation schedule \"" << spec << "\": " << what << " " << t << " is too large");
  return std::stoll(t);
}

}  // namespace

AccumulationSchedule AccumulationSchedule::parse(const std::string& spec) {
  MG_CHECK(!spec.empty(), "accumulation schedule: empty string (expected \"epoch:N,...\", e.g. \"0:8,4:2\")");
  AccumulationSchedule s;
  if (spec.find(':') == std::string::npos && spec.find(',') == std::string::npos) {
    return AccumulationSchedule(parse_int(spec, spec, "N"));
  }
  s.table_.clear();
  std::stringstream ss(spec);
  std::string item;
  size_t items = 0, commas = 0;
  for (char c : spec) commas += c == ',';
  while (std::getline(ss, item, ',')) {
    ++items;
    const size_t colon = item.find(':');
    MG_CHECK(colon != std::string::npos && item.find(':', colon + 1) == std::string::npos,
             "accumulation schedule \"" << spec << "\": entry \"" << item
                                        << "\" is not \"epoch:N\" (e.g. \"0:8,4:2\")");
    const int64_t epoch = parse_int(item.substr(0, colon), spec, "epoch");
    const int64_t n = parse_int(item.substr(colon + 1), spec, "N");
    MG_CHECK(n >= 1, "accumulation schedule \"" << spec << "\": N must be >= 1 at epoch " << epoch << ", got " << n);
    MG_CHECK(!s.table_.count(epoch), "accumulation schedule \"" << spec << "\": epoch " << epoch << " appears twice");
    s.table_[epoch] = n;
  }
  MG_CHECK(items == commas + 1, "accumulation schedule \"" << spec << "\": empty entry (stray comma)");
  if (!s.table_.count(0)) s.table_[0] = 1;
  return s;
}

int64_t AccumulationSchedule::steps_for_epoch(int64_t epoch) const {
  MG_CHECK(epoch >= 0, "accumulation schedule: epoch " << epoch);
  auto it = table_.upper_bound(epoch);
  --it;  // table_ always has key 0
  return it->second;
}

std::string AccumulationSchedule::str() const {
  std::ostringstream out;
  for (auto it = table_.begin(); it != table_.end(); ++it) {
    out << (it == table_.begin() ? "" : ",") << it->first << ":" << it->second;
  }
  return out.str();
}

float scale_lr_linear(float base_lr, int64_t base_batch, int64_t effective_batch) {
  MG_CHECK(base_batch > 0 && effective_batch > 0,
           "scale_lr_linear: batch sizes must be > 0, got " << base_batch << " and " << effective_batch);
  return static_cast<float>(static_cast<double>(base_lr) * static_cast<double>(effective_batch) /
                            static_cast<double>(base_batch));
}

}  // namespace mg::optim
