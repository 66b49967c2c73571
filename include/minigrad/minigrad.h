// libminigrad: one include for the whole public API.
//
//   #include <minigrad/minigrad.h>
//
//   mg::manual_seed(0);
//   auto model = mg::nn::make_mlp({784, 512, 512, 10});
//   mg::optim::SGD opt(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
//   opt.zero_grad();
//   mg::cross_entropy(model->forward(x), y).backward();
//   opt.step();
//
// Every header here includes only other headers of include/minigrad/ and the C++ standard
// library: an outside project needs no Eigen, CUDA or other include path.
#pragma once

#include <minigrad/core/autocast.h>
#include <minigrad/core/autograd.h>
#include <minigrad/core/checkpoint.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/error.h>
#include <minigrad/core/memory.h>
#include <minigrad/core/profiler.h>
#include <minigrad/core/rng.h>
#include <minigrad/core/tensor.h>
#include <minigrad/core/threads.h>
#include <minigrad/cuda.h>
#include <minigrad/data/dataset.h>
#include <minigrad/data/idx.h>
#include <minigrad/data/image_folder.h>
#include <minigrad/data/loader.h>
#include <minigrad/data/tokens.h>
#include <minigrad/dist/dist.h>
#include <minigrad/nn/checkpoint_plan.h>
#include <minigrad/nn/memory_report.h>
#include <minigrad/nn/models.h>
#include <minigrad/nn/module.h>
#include <minigrad/nn/serialize.h>
#include <minigrad/nn/train_plan.h>
#include <minigrad/ops/ops.h>
#include <minigrad/optim/accumulate.h>
#include <minigrad/optim/optimizer.h>
#include <minigrad/optim/train_state.h>
#include <minigrad/train/trainer.h>
#include <minigrad/util/bytes.h>
#include <minigrad/util/file.h>
