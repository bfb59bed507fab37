#include "ops/registry.h"

namespace tessera::ops {

// One registration function per op family (ops/<family>.cc).
void RegisterElementwiseOps(OpRegistry& registry);
void RegisterMatmulOps(OpRegistry& registry);
void RegisterNormSoftmaxOps(OpRegistry& registry);
void RegisterLossOps(OpRegistry& registry);
void RegisterShapeOps(OpRegistry& registry);
void RegisterReduceOps(OpRegistry& registry);
void RegisterEmbeddingOps(OpRegistry& registry);
void RegisterRandomOps(OpRegistry& registry);
void RegisterOptimizerOps(OpRegistry& registry);
void RegisterAttentionOps(OpRegistry& registry);

void RegisterBuiltinOps(OpRegistry& registry) {
  RegisterElementwiseOps(registry);
  RegisterMatmulOps(registry);
  RegisterNormSoftmaxOps(registry);
  RegisterLossOps(registry);
  RegisterShapeOps(registry);
  RegisterReduceOps(registry);
  RegisterEmbeddingOps(registry);
  RegisterRandomOps(registry);
  RegisterOptimizerOps(registry);
  RegisterAttentionOps(registry);
}

}  // namespace tessera::ops
