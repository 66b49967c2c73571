// The models of the apps and benchmarks, laid out as their PyTorch counterparts so that parameter
// names and shapes match (weights load on either side).
//
//   auto mlp = mg::nn::make_mlp({784, 512, 512, 10});      // Flatten, Linear, ReLU, ... Linear
//   auto vgg = mg::nn::make_vgg16(2, 8);                    // torchvision layout, widths / 8
#pragma once

#include <memory>
#include <vector>

#include <minigrad/nn/module.h>

namespace mg::nn {

// Flatten, then Linear(sizes[i], sizes[i+1]) with ReLU between (not after the last).
// Parameter names: "1.weight", "1.bias", "3.weight", ... as torch.nn.Sequential gives them.
std::shared_ptr<Sequential> make_mlp(const std::vector<int64_t>& sizes);

// VGG16 as torchvision builds it (configuration D): 13 Conv2d(3x3, padding 1) + ReLU, 5
// MaxPool2d(2), AdaptiveAvgPool2d(7, 7), Flatten, Linear(512*7*7, 4096), ReLU, Dropout(0.5),
// Linear(4096, 4096), ReLU, Dropout(0.5), Linear(4096, num_classes), as ONE flat Sequential
// (a chain, which the checkpoint planner needs). Channel and hidden sizes are divided by
// width_div (>= 1) to fit a CPU.
std::shared_ptr<Sequential> make_vgg16(int64_t num_classes, int64_t width_div = 1, float dropout_p = 0.5f);

}  // namespace mg::nn
