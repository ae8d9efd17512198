// Seed decode attention in CUDA C++: one block of 4 warps per (sequence, query head). Each
// warp walks every 4th cached position; a lane holds head_dim/32 dimensions (interleaved, so
// a warp reads a key row in one coalesced sweep), the score is a warp-shuffle sum, and each
// warp keeps its own online softmax; the 4 partial results are merged through shared memory.
// A fair starting point: the query heads of a group each read the shared key/value head
// again, one block per head (no split of long caches over more blocks), scalar loads.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int WARPS = 4;

template <int D>
__global__ void attn_decode(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                            const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ o,
                            int kv_len, int n_q_heads, int group, float scale) {
  constexpr int DL = D / 32;
  __shared__ float wm[WARPS], wl[WARPS], wacc[WARPS][D];
  const int bh = blockIdx.x;
  const int b = bh / n_q_heads, h = bh % n_q_heads;
  const int n_kv_heads = n_q_heads / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t kv_base = ((size_t)b * n_kv_heads + h / group) * kv_len * D;
  float qr[DL], acc[DL];
#pragma unroll
  for (int i = 0; i < DL; ++i) {
    qr[i] = __bfloat162float(q[(size_t)bh * D + i * 32 + lane]) * scale;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = warp; j < kv_len; j += WARPS) {
    const __nv_bfloat16* kr = k + kv_base + (size_t)j * D;
    const __nv_bfloat16* vr = v + kv_base + (size_t)j * D;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < DL; ++i) s += qr[i] * __bfloat162float(kr[i * 32 + lane]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new);
    const float p = __expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < DL; ++i) acc[i] = acc[i] * corr + p * __bfloat162float(vr[i * 32 + lane]);
    m = m_new;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < DL; ++i) wacc[warp][i * 32 + lane] = acc[i];
  __syncthreads();
  if (warp == 0) {
    float gm = -INFINITY;
    for (int w = 0; w < WARPS; ++w) gm = fmaxf(gm, wm[w]);
    float gl = 0.f, out[DL] = {};
    for (int w = 0; w < WARPS; ++w) {
      const float f = (wl[w] > 0.f) ? __expf(wm[w] - gm) : 0.f;  // a warp may have had no keys
      gl += wl[w] * f;
#pragma unroll
      for (int i = 0; i < DL; ++i) out[i] += wacc[w][i * 32 + lane] * f;
    }
#pragma unroll
    for (int i = 0; i < DL; ++i) o[(size_t)bh * D + i * 32 + lane] = __float2bfloat16(out[i] / gl);
  }
}

torch::Tensor run(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == torch::kBFloat16, "q: bf16 CUDA tensor");
  auto qc = q.contiguous();
  auto kc = k_cache.contiguous();
  auto vc = v_cache.contiguous();
  const int batch = qc.size(0), n_q_heads = qc.size(1), head_dim = qc.size(2);
  const int kv_len = kc.size(2), group = n_q_heads / kc.size(1);
  auto o = torch::empty_like(qc);
  if (batch * n_q_heads == 0) return o;
  TORCH_CHECK(kv_len > 0, "empty cache");
  const float scale = 1.f / sqrtf((float)head_dim);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto qp = reinterpret_cast<const __nv_bfloat16*>(qc.data_ptr());
  auto kp = reinterpret_cast<const __nv_bfloat16*>(kc.data_ptr());
  auto vp = reinterpret_cast<const __nv_bfloat16*>(vc.data_ptr());
  auto op = reinterpret_cast<__nv_bfloat16*>(o.data_ptr());
  if (head_dim == 128) {
    attn_decode<128><<<batch * n_q_heads, WARPS * 32, 0, stream>>>(qp, kp, vp, op, kv_len, n_q_heads, group, scale);
  } else if (head_dim == 64) {
    attn_decode<64><<<batch * n_q_heads, WARPS * 32, 0, stream>>>(qp, kp, vp, op, kv_len, n_q_heads, group, scale);
  } else {
    TORCH_CHECK(false, "this seed handles head_dim 64 and 128, got ", head_dim);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return o;
}
