// Out-of-memory messages in the apps (Note [recovering from out-of-memory] in
// minigrad/optim/accumulate.h; vgg_ckpt and gpt_train recover through mg::Trainer, mnist_ga through
// train_epoch's callback).
#pragma once

#include <exception>
#include <string>

// The first line of an error's message (its hint follows on the next lines).
inline std::string first_line(const std::exception& e) {
  const std::string what = e.what();
  return what.substr(0, what.find('\n'));
}
