module {
  func.func @main(%table: tensor<16x8xf32> {ptc.param = "wte", ptc.init = "normal:0.02"}, %w: tensor<8x16xf32> {ptc.param = "w", ptc.init = "normal:0.02"}, %ids: tensor<4x6xi32> {ptc.input = "tokens"}, %tg: tensor<4x6xi32> {ptc.input = "targets"}) -> (tensor<f32> {ptc.loss}) {
    %e = ptc.embedding %table, %ids : tensor<16x8xf32>, tensor<4x6xi32> -> tensor<4x6x8xf32>
    %s = ptc.softmax %e : tensor<4x6x8xf32>
    %l = ptc.matmul %s, %w : tensor<4x6x8xf32>, tensor<8x16xf32> -> tensor<4x6x16xf32>
    %c = ptc.cross_entropy %l, %tg : tensor<4x6x16xf32>, tensor<4x6xi32> -> tensor<f32>
    return %c : tensor<f32>
  }
}
