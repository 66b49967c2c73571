#include <minigrad/nn/models.h>

#include <algorithm>
#include <sstream>

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

std::shared_ptr<Sequential> make_vgg16(int64_t num_classes, int64_t width_div, float dropout_p, Layout layout) {
  MG_CHECK(width_div >= 1, "make_vgg16: width_div must be >= 1, got " << width_div);
  MG_CHECK(num_classes >= 1, "make_vgg16: num_classes must be >= 1, got " << num_classes);
  const int64_t kPool = -1;
  const std::vector<int64_t> cfg = {64, 64, kPool, 128, 128, kPool, 256, 256, 256, kPool,
                                    512, 512, 512, kPool, 512, 512, 512, kPool};
  auto m = std::make_shared<Sequential>();
  int64_t in = 3;
  for (int64_t c : cfg) {
    if (c == kPool) {
      m->add<MaxPool2d>(2, 2, 0, layout);
      continue;
    }
    const int64_t out = std::max<int64_t>(1, c / width_div);
    m->add<Conv2d>(in, out, 3, 1, 1, /*bias=*/true, layout);
    m->add<ReLU>();
    in = out;
  }
  const int64_t hidden = std::max<int64_t>(1, 4096 / width_div);
  m->add<AdaptiveAvgPool2d>(7, 7, layout);
  m->add<Flatten>(layout);
  m->add<Linear>(in * 7 * 7, hidden);
  m->add<ReLU>();
  m->add<Dropout>(dropout_p);
  m->add<Linear>(hidden, hidden);
  m->add<ReLU>();
  m->add<Dropout>(dropout_p);
  m->add<Linear>(hidden, num_classes);
  return m;
}

// ---- ResNet ---------------------------------------------------------------------------------------

namespace {

std::shared_ptr<Module> conv(int64_t in, int64_t out, int k, int stride, int pad, Layout layout) {
  return std::make_shared<Conv2d>(in, out, k, stride, pad, /*bias=*/false, layout);
}

std::shared_ptr<Module> bn(int64_t c, Layout layout) {
  return std::make_shared<BatchNorm2d>(c, 1e-5f, 0.1f, /*affine=*/true, layout);
}

// torchvision: a strided 1x1 conv and a BatchNorm when the block changes the shape, else none.
std::shared_ptr<Module> make_downsample(int64_t in, int64_t out, int stride, Layout layout) {
  if (stride == 1 && in == out) return nullptr;
  auto d = std::make_shared<Sequential>();
  d->push_back(conv(in, out, 1, stride, 0, layout));
  d->push_back(bn(out, layout));
  return d;
}

std::string block_name(const char* kind, int64_t inplanes, int64_t planes, int stride, bool downsample) {
  std::ostringstream os;
  os << kind << "(" << inplanes << ", " << planes << ", stride=" << stride << (downsample ? ", downsample" : "") << ")";
  return os.str();
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int stride, Layout layout)
    : inplanes_(inplanes), planes_(planes), stride_(stride) {
  MG_CHECK(inplanes > 0 && planes > 0 && stride > 0,
           "BasicBlock: bad arguments (inplanes " << inplanes << ", planes " << planes << ", stride " << stride << ")");
  // Registration order is torchvision's, so state_dict() lists tensors in its order.
  register_module("conv1", conv1_ = conv(inplanes, planes, 3, stride, 1, layout));
  register_module("bn1", bn1_ = bn(planes, layout));
  register_module("relu", std::make_shared<ReLU>());
  register_module("conv2", conv2_ = conv(planes, planes, 3, 1, 1, layout));
  register_module("bn2", bn2_ = bn(planes, layout));
  if ((downsample_ = make_downsample(inplanes, planes * expansion, stride, layout))) register_module("downsample", downsample_);
}

namespace {
// Whether bn is a BatchNorm with its ReLU fused; sets it fused when `fuse`.
bool fused_bn(const std::shared_ptr<Module>& bn, bool fuse = false) {
  auto* b = dynamic_cast<BatchNorm*>(bn.get());
  if (b && fuse) b->relu = true;
  return b && b->relu;
}
// relu(bn(x)), the ReLU in bn when it is fused.
Tensor bn_relu(const std::shared_ptr<Module>& bn, const Tensor& x) {
  Tensor y = bn->forward(x);
  return fused_bn(bn) ? y : relu(y);
}
}  // namespace

size_t BasicBlock::fuse_relu() {
  if (fused_bn(bn1_)) return 0;
  fused_bn(bn1_, true);
  return 1;
}

size_t Bottleneck::fuse_relu() {
  size_t n = 0;
  for (auto* bn : {&bn1_, &bn2_}) {
    if (!fused_bn(*bn)) n += fused_bn(*bn, true) ? 1 : 0;
  }
  return n;
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = bn_relu(bn1_, conv1_->forward(x));
  out = bn2_->forward(conv2_->forward(out));
  return relu(add(out, downsample_ ? downsample_->forward(x) : x));
}

std::string BasicBlock::name() const {
  return block_name("BasicBlock", inplanes_, planes_, stride_, downsample_ != nullptr);
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int stride, Layout layout)
    : inplanes_(inplanes), planes_(planes), stride_(stride) {
  MG_CHECK(inplanes > 0 && planes > 0 && stride > 0,
           "Bottleneck: bad arguments (inplanes " << inplanes << ", planes " << planes << ", stride " << stride << ")");
  register_module("conv1", conv1_ = conv(inplanes, planes, 1, 1, 0, layout));
  register_module("bn1", bn1_ = bn(planes, layout));
  register_module("conv2", conv2_ = conv(planes, planes, 3, stride, 1, layout));
  register_module("bn2", bn2_ = bn(planes, layout));
  register_module("conv3", conv3_ = conv(planes, planes * expansion, 1, 1, 0, layout));
  register_module("bn3", bn3_ = bn(planes * expansion, layout));
  register_module("relu", std::make_shared<ReLU>());
  if ((downsample_ = make_downsample(inplanes, planes * expansion, stride, layout))) register_module("downsample", downsample_);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = bn_relu(bn1_, conv1_->forward(x));
  out = bn_relu(bn2_, conv2_->forward(out));
  out = bn3_->forward(conv3_->forward(out));
  return relu(add(out, downsample_ ? downsample_->forward(x) : x));
}

std::string Bottleneck::name() const {
  return block_name("Bottleneck", inplanes_, planes_, stride_, downsample_ != nullptr);
}

namespace {

template <typename Block>
std::shared_ptr<Sequential> make_resnet(const char* what, const std::vector<int>& layers, int64_t num_classes,
                                        int64_t width_div, float dropout_p, Layout layout) {
  MG_CHECK(width_div >= 1, what << ": width_div must be >= 1, got " << width_div);
  MG_CHECK(num_classes >= 1, what << ": num_classes must be >= 1, got " << num_classes);
  MG_CHECK(dropout_p >= 0.0f && dropout_p < 1.0f, what << ": dropout_p must be in [0, 1), got " << dropout_p);
  auto width = [&](int64_t c) { return std::max<int64_t>(1, c / width_div); };
  auto m = std::make_shared<Sequential>();
  int64_t inplanes = width(64);
  m->add_named<Conv2d>("conv1", 3, inplanes, 7, 2, 3, /*bias=*/false, layout);
  m->add_named<BatchNorm2d>("bn1", inplanes, 1e-5f, 0.1f, /*affine=*/true, layout);
  m->add_named<ReLU>("relu");
  m->add_named<MaxPool2d>("maxpool", 3, 2, 1, layout);
  for (size_t stage = 0; stage < layers.size(); ++stage) {
    const int64_t planes = width(int64_t{64} << stage);
    for (int b = 0; b < layers[stage]; ++b) {
      const int stride = (stage > 0 && b == 0) ? 2 : 1;
      m->add_named<Block>("layer" + std::to_string(stage + 1) + "." + std::to_string(b), inplanes, planes, stride, layout);
      inplanes = planes * Block::expansion;
    }
  }
  m->add_named<AdaptiveAvgPool2d>("avgpool", 1, 1, layout);
  m->add_named<Flatten>("flatten", layout);
  if (dropout_p > 0.0f) m->add_named<Dropout>("dropout", dropout_p);
  m->add_named<Linear>("fc", inplanes, num_classes);
  return m;
}

}  // namespace

std::shared_ptr<Sequential> make_resnet18(int64_t num_classes, int64_t width_div, float dropout_p, Layout layout) {
  return make_resnet<BasicBlock>("make_resnet18", {2, 2, 2, 2}, num_classes, width_div, dropout_p, layout);
}

std::shared_ptr<Sequential> make_resnet34(int64_t num_classes, int64_t width_div, float dropout_p, Layout layout) {
  return make_resnet<BasicBlock>("make_resnet34", {3, 4, 6, 3}, num_classes, width_div, dropout_p, layout);
}

std::shared_ptr<Sequential> make_resnet50(int64_t num_classes, int64_t width_div, float dropout_p, Layout layout) {
  return make_resnet<Bottleneck>("make_resnet50", {3, 4, 6, 3}, num_classes, width_div, dropout_p, layout);
}

size_t fuse_relu(Sequential& m) {
  size_t fused = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::shared_ptr<Module> layer = m.at(i);
    if (auto inner = std::dynamic_pointer_cast<Sequential>(layer)) {
      fused += fuse_relu(*inner);
    } else if (auto block = std::dynamic_pointer_cast<BasicBlock>(layer)) {
      fused += block->fuse_relu();
    } else if (auto block = std::dynamic_pointer_cast<Bottleneck>(layer)) {
      fused += block->fuse_relu();
    }
    if (i + 1 >= m.size() || !std::dynamic_pointer_cast<ReLU>(m.at(i + 1))) continue;
    auto* conv = dynamic_cast<Conv2d*>(layer.get());
    auto* bn = dynamic_cast<BatchNorm*>(layer.get());
    if (conv && !conv->relu) conv->relu = true;
    else if (bn && !bn->relu) bn->relu = true;
    else continue;
    m.erase(i + 1);
    ++fused;
  }
  return fused;
}

std::shared_ptr<Sequential> make_model(const std::string& name, int64_t num_classes, int64_t width_div, Layout layout) {
  if (name == "vgg16") return make_vgg16(num_classes, width_div, 0.5f, layout);
  if (name == "resnet18") return make_resnet18(num_classes, width_div, 0.0f, layout);
  if (name == "resnet34") return make_resnet34(num_classes, width_div, 0.0f, layout);
  if (name == "resnet50") return make_resnet50(num_classes, width_div, 0.0f, layout);
  MG_FAIL("make_model: unknown model '" << name << "'; expected vgg16, resnet18, resnet34 or resnet50");
}

}  // namespace mg::nn
