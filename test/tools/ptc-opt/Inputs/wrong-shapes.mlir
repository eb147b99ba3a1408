func.func @f(%x: tensor<8x64xf32>, %w: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %0 = ptc.matmul %x, %w : tensor<8x64xf32>, tensor<32x16xf32> -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
