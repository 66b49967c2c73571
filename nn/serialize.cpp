// Implemented in a following commit (safetensors).
#include "nn/serialize.h"
