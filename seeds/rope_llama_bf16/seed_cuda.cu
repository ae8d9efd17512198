// Seed rotary embedding in CUDA C++: one thread per rotated pair (token, head, i), reading
// x[..., i] and x[..., i + half] and the token's cos/sin[i], float32 math, bfloat16 out.
// A fair starting point: scalar 2-byte loads, cos/sin re-read by every head, no vectorisation.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

__global__ void rope_pairs(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ cos_t,
                           const __nv_bfloat16* __restrict__ sin_t, __nv_bfloat16* __restrict__ y,
                           long long n_pairs, int n_heads, int half) {
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_pairs) return;
  const int i = idx % half;
  const long long th = idx / half;  // token * n_heads + head
  const long long t = th / n_heads;
  const long long base = th * 2 * half;
  const float x1 = __bfloat162float(x[base + i]);
  const float x2 = __bfloat162float(x[base + i + half]);
  const float c = __bfloat162float(cos_t[t * half + i]);
  const float s = __bfloat162float(sin_t[t * half + i]);
  y[base + i] = __float2bfloat16(x1 * c - x2 * s);
  y[base + i + half] = __float2bfloat16(x2 * c + x1 * s);
}

torch::Tensor run(torch::Tensor x, torch::Tensor cos_table, torch::Tensor sin_table) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x: bf16 CUDA tensor");
  auto xc = x.contiguous();
  auto cc = cos_table.contiguous();
  auto sc = sin_table.contiguous();
  auto y = torch::empty_like(xc);
  const int n_heads = xc.size(1), half = xc.size(2) / 2;
  const long long n_pairs = (long long)xc.size(0) * n_heads * half;
  if (n_pairs == 0) return y;
  const int threads = 256;
  const long long blocks = (n_pairs + threads - 1) / threads;
  rope_pairs<<<(unsigned)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(xc.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(cc.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(sc.data_ptr()),
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), n_pairs, n_heads, half);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
