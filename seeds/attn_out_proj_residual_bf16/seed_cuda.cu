// Seed o_proj + residual in CUDA C++: a shared-memory tiled GEMM (64x64 output tile per block
// of 256 threads, K in steps of 16, a 4x4 sub-tile per thread, float32 accumulation) whose
// epilogue adds the residual to the float32 accumulator and rounds once to bfloat16.
// A fair starting point: no tensor cores (mma/wgmma), no vector loads, no double buffering,
// no split-K for decode batches.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256

__global__ void oproj_residual(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w,
                               const __nv_bfloat16* __restrict__ res, __nv_bfloat16* __restrict__ y,
                               int M, int N, int K) {
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 1];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += THREADS) {
      const int r = i / BK, c = i % BK;
      const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? __bfloat162float(a[(size_t)gm * K + gk]) : 0.f;
      Bs[c][r] = (gn < N && gk < K) ? __bfloat162float(w[(size_t)gn * K + gk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = As[kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = Bs[kk][tx + j * (BN / TN)];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += av[i] * bv[j];
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
      if (gn < N) {
        const size_t o = (size_t)gm * N + gn;
        y[o] = __float2bfloat16(acc[i][j] + __bfloat162float(res[o]));
      }
    }
  }
}

torch::Tensor run(torch::Tensor attn_output, torch::Tensor residual, torch::Tensor o_proj_weight) {
  TORCH_CHECK(attn_output.is_cuda() && attn_output.scalar_type() == torch::kBFloat16, "bf16 CUDA input");
  auto ac = attn_output.contiguous();
  auto rc = residual.contiguous();
  auto wc = o_proj_weight.contiguous();
  const int M = ac.size(0), K = ac.size(1), N = wc.size(0);
  auto y = torch::empty({M, N}, ac.options());
  if (M == 0 || N == 0) return y;
  dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
  oproj_residual<<<grid, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(ac.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(wc.data_ptr()),
      reinterpret_cast<const __nv_bfloat16*>(rc.data_ptr()),
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), M, N, K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
