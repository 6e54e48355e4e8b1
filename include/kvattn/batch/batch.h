// kvattn/batch/batch.h — everything of the batch layer.
#pragma once

#include "kvattn/batch/batch_preparer.h"
#include "kvattn/batch/common_attention_metadata.h"
#include "kvattn/batch/cpu_gpu_buffer.h"
#include "kvattn/batch/input_batch.h"
#include "kvattn/batch/mm_prefix.h"
#include "kvattn/batch/slot_mapping.h"
#include "kvattn/batch/split.h"
#include "kvattn/batch/tensor_access.h"
