// The apps' plan through mg::Trainer, its errors naming the flag they are about.
//
//   const mg::nn::TrainPlan& tp = plan_naming_flags(trainer, !memory_budget.empty(), memory_limit);
#pragma once

#include <string>

#include <minigrad/core/error.h>
#include <minigrad/train/trainer.h>

// trainer.plan(); an mg::Error from it names the flag behind it: --memory-limit when the cap leaves
// no plan, --batch-size when the batch cannot fit (the Trainer's pre-flight check), else the
// plan's flag (--memory-budget, or --checkpoint). Out-of-memory errors pass as they are (main
// names the cap).
inline const mg::nn::TrainPlan& plan_naming_flags(mg::Trainer& trainer, bool budget, const std::string& memory_limit) {
  try {
    return trainer.plan();
  } catch (const mg::OutOfMemoryError&) {
    throw;
  } catch (const mg::Error& e) {
    const std::string what = e.what();
    if (!memory_limit.empty() && what.find("no plan fits what the device") != std::string::npos) {
      throw mg::Error("under --memory-limit " + memory_limit + ": " + what);
    }
    if (what.rfind("Trainer: a micro-batch", 0) == 0 || what.rfind("Trainer: no plan fits what", 0) == 0) {
      throw mg::Error("--batch-size: " + what);
    }
    throw mg::Error(std::string(budget ? "--memory-budget" : "--checkpoint") + ": " + what);
  }
}
