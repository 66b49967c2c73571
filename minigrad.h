// libminigrad: one include for the whole public API.
//
//   #include <minigrad/minigrad.h>
//   mg::nn::Sequential model; ...; mg::optim::SGD opt(model.parameters(), {.lr = 0.01f});
#pragma once

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "nn/checkpoint_plan.h"
#include "nn/models.h"
#include "nn/module.h"
#include "nn/serialize.h"
#include "optim/accumulate.h"
#include "optim/optimizer.h"
#include "optim/train_state.h"
