// Seed MLP block of a Llama decoder layer in CUDA C++, as three plain kernels that keep the
// model's bfloat16 intermediates: (1) RMSNorm, one block per row -> h; (2) a shared-memory
// tiled GEMM for gate and up over the same h tiles with silu(gate) * up in the epilogue
// -> act; (3) the same tiled GEMM for down with the residual add in the epilogue. GEMM tiles
// are 64x64 per block of 256 threads, K in steps of 16, 4x4 per thread, float32 accumulation.
// A fair starting point: h and act round-trip through memory, no tensor cores, no vector
// loads, no double buffering, no split-K for decode.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int BM = 64, BN = 64, BK = 16, TM = 4, TN = 4;
constexpr int THREADS = (BM / TM) * (BN / TN);  // 256

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16(v)); }

__global__ void rmsnorm_row(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                            __nv_bfloat16* __restrict__ h, int n_cols, float eps) {
  __shared__ float buf[THREADS];
  const __nv_bfloat16* xr = x + (size_t)blockIdx.x * n_cols;
  __nv_bfloat16* hr = h + (size_t)blockIdx.x * n_cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < n_cols; c += THREADS) {
    const float v = __bfloat162float(xr[c]);
    s += v * v;
  }
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int k = THREADS / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) buf[threadIdx.x] += buf[threadIdx.x + k];
    __syncthreads();
  }
  const float inv_rms = rsqrtf(buf[0] / n_cols + eps);
  for (int c = threadIdx.x; c < n_cols; c += THREADS)
    hr[c] = __float2bfloat16(__bfloat162float(xr[c]) * inv_rms * __bfloat162float(w[c]));
}

// C[M, N] = A[M, K] @ W[N, K]^T for one or two weight matrices; the epilogue is chosen by
// GATE_UP: silu(round(A W1^T)) * round(A W2^T), else round(A W1^T) + residual.
template <bool GATE_UP>
__global__ void gemm_epilogue(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ w1,
                              const __nv_bfloat16* __restrict__ w2, const __nv_bfloat16* __restrict__ res,
                              __nv_bfloat16* __restrict__ y, int M, int N, int K) {
  __shared__ float As[BK][BM + 1];
  __shared__ float W1s[BK][BN + 1];
  __shared__ float W2s[GATE_UP ? BK : 1][BN + 1];
  const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc1[TM][TN] = {}, acc2[TM][TN] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = threadIdx.x; i < BM * BK; i += THREADS) {
      const int r = i / BK, c = i % BK;
      const int gm = m0 + r, gn = n0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? __bfloat162float(a[(size_t)gm * K + gk]) : 0.f;
      const bool in_w = gn < N && gk < K;
      W1s[c][r] = in_w ? __bfloat162float(w1[(size_t)gn * K + gk]) : 0.f;
      if (GATE_UP) W2s[c][r] = in_w ? __bfloat162float(w2[(size_t)gn * K + gk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float av[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = As[kk][ty + i * (BM / TM)];
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float b1 = W1s[kk][tx + j * (BN / TN)];
        const float b2 = GATE_UP ? W2s[kk][tx + j * (BN / TN)] : 0.f;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          acc1[i][j] += av[i] * b1;
          if (GATE_UP) acc2[i][j] += av[i] * b2;
        }
      }
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
      if (gn >= N) continue;
      const size_t o = (size_t)gm * N + gn;
      float v;
      if (GATE_UP) {
        const float gate = round_bf16(acc1[i][j]), up = round_bf16(acc2[i][j]);
        v = gate / (1.f + __expf(-gate)) * up;
      } else {
        v = round_bf16(acc1[i][j]) + __bfloat162float(res[o]);  // the model rounds before the add
      }
      y[o] = __float2bfloat16(v);
    }
  }
}

torch::Tensor run(torch::Tensor hidden_states, torch::Tensor norm_weight, torch::Tensor gate_proj,
                  torch::Tensor up_proj, torch::Tensor down_proj, double eps) {
  TORCH_CHECK(hidden_states.is_cuda() && hidden_states.scalar_type() == torch::kBFloat16, "bf16 CUDA input");
  auto x = hidden_states.contiguous();
  auto nw = norm_weight.contiguous();
  auto wg = gate_proj.contiguous();
  auto wu = up_proj.contiguous();
  auto wd = down_proj.contiguous();
  const int T = x.size(0), H = x.size(1), I = wg.size(0);
  auto out = torch::empty_like(x);
  if (T == 0) return out;
  auto h = torch::empty_like(x);
  auto act = torch::empty({T, I}, x.options());
  auto stream = at::cuda::getCurrentCUDAStream();
  auto bf = [](const torch::Tensor& t) { return reinterpret_cast<const __nv_bfloat16*>(t.data_ptr()); };
  auto bfw = [](torch::Tensor& t) { return reinterpret_cast<__nv_bfloat16*>(t.data_ptr()); };
  rmsnorm_row<<<T, THREADS, 0, stream>>>(bf(x), bf(nw), bfw(h), H, static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  dim3 grid_up((I + BN - 1) / BN, (T + BM - 1) / BM);
  gemm_epilogue<true><<<grid_up, THREADS, 0, stream>>>(bf(h), bf(wg), bf(wu), nullptr, bfw(act), T, I, H);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  dim3 grid_down((H + BN - 1) / BN, (T + BM - 1) / BM);
  gemm_epilogue<false><<<grid_down, THREADS, 0, stream>>>(bf(act), bf(wd), nullptr, bf(x), bfw(out), T, H, I);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
