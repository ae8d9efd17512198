// Seed GEMM in CUDA C++: y = x @ weight.T, bfloat16 in and out, float32 accumulation.
// Classic shared-memory tiling: a 64x64 output tile per block of 256 threads, K in steps of
// 16, each thread accumulating a 4x4 sub-tile in registers. A fair starting point: no tensor
// cores (mma/wgmma), no vector loads, no double buffering, no split-K for small M.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256

__global__ void linear_bf16(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                            __nv_bfloat16* __restrict__ y, int M, int N, int K) {
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += THREADS) {
      const int r = i / BK, c = i % BK;
      const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? __bfloat162float(x[(size_t)gm * K + gk]) : 0.f;
      Bs[c][r] = (gn < N && gk < K) ? __bfloat162float(w[(size_t)gn * K + gk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int gm = m0 + ty + i * (BM / TM);
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int gn = n0 + tx + j * (BN / TN);
      if (gn < N) y[(size_t)gm * N + gn] = __float2bfloat16(acc[i][j]);
    }
  }
}

torch::Tensor run(torch::Tensor x, torch::Tensor weight) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x: bf16 CUDA tensor");
  TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kBFloat16, "weight: bf16 CUDA tensor");
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  const int M = xc.size(0), K = xc.size(1), N = wc.size(0);
  auto y = torch::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return y;
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
  linear_bf16<<<grid, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(xc.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(wc.data_ptr()),
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), M, N, K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
