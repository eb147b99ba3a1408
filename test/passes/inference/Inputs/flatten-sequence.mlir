// Input of derive-decode.test: a model that flattens each sequence into one
// feature vector (its logits depend on every position at once).
func.func @step(%table: tensor<16x4xf32> {ptc.param = "table"}, %w: tensor<16x32xf32> {ptc.param = "w"},
                %tokens: tensor<2x8xi32> {ptc.input = "tokens"}, %targets: tensor<2x1xi32> {ptc.input = "targets"})
    -> (tensor<f32> {ptc.loss}) {
  %x = ptc.embedding %table, %tokens : tensor<16x4xf32>, tensor<2x8xi32> -> tensor<2x8x4xf32>
  %flat = ptc.reshape %x : tensor<2x8x4xf32> -> tensor<2x32xf32>
  %h = ptc.matmul %flat, %w {transpose_rhs = true} : tensor<2x32xf32>, tensor<16x32xf32> -> tensor<2x16xf32>
  %logits = ptc.reshape %h : tensor<2x16xf32> -> tensor<2x1x16xf32>
  %loss = ptc.cross_entropy %logits, %targets : tensor<2x1x16xf32>, tensor<2x1xi32> -> tensor<f32>
  return %loss : tensor<f32>
}
