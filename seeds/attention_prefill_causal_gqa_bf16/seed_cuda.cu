// Seed causal GQA attention in CUDA C++ (flash-style, no tensor cores): a block of 256
// threads takes 64 queries of one head, 4 threads per query row, each holding a quarter of
// the head dimension (interleaved) of q and of the float32 accumulator. Key/value tiles of 64
// positions go through shared memory; every row walks the keys one by one with an online
// softmax (scores summed across its 4 threads by warp shuffles).
// A fair starting point: scalar float32 math instead of mma, one key at a time, the heads of a
// group each load their shared key/value head again, no pipelining.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>

constexpr int ROWS = 64;       // queries per block
constexpr int PARTS = 4;       // threads per query row
constexpr int KTILE = 64;      // keys per shared-memory tile
constexpr int THREADS = ROWS * PARTS;

template <int D>
__global__ void attn_causal(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                            const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ o,
                            int seq_len, int n_q_heads, int group, float scale) {
  constexpr int DP = D / PARTS;
  __shared__ __nv_bfloat16 Ks[KTILE][D];
  __shared__ __nv_bfloat16 Vs[KTILE][D];
  const int bh = blockIdx.y;
  const int b = bh / n_q_heads, h = bh % n_q_heads;
  const int n_kv_heads = n_q_heads / group;
  const int row = threadIdx.x / PARTS, part = threadIdx.x % PARTS;
  const int qi = blockIdx.x * ROWS + row;
  const size_t q_off = ((size_t)bh * seq_len + min(qi, seq_len - 1)) * D;
  const size_t kv_base = ((size_t)b * n_kv_heads + h / group) * seq_len * D;
  float qr[DP], acc[DP];
#pragma unroll
  for (int i = 0; i < DP; ++i) {
    qr[i] = __bfloat162float(q[q_off + i * PARTS + part]) * scale;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int last_key = min((int)(blockIdx.x + 1) * ROWS, seq_len);  // exclusive
  for (int k0 = 0; k0 < last_key; k0 += KTILE) {
    const int n_keys = min(KTILE, last_key - k0);
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_keys * D; idx += THREADS) {
      Ks[idx / D][idx % D] = k[kv_base + (size_t)k0 * D + idx];
      Vs[idx / D][idx % D] = v[kv_base + (size_t)k0 * D + idx];
    }
    __syncthreads();
    for (int j = 0; j < n_keys; ++j) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < DP; ++i) s += qr[i] * __bfloat162float(Ks[j][i * PARTS + part]);
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (k0 + j > qi) s = -INFINITY;  // causal mask (key 0 is always kept, so m is finite)
      const float m_new = fmaxf(m, s);
      const float corr = __expf(m - m_new);
      const float p = __expf(s - m_new);
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < DP; ++i) acc[i] = acc[i] * corr + p * __bfloat162float(Vs[j][i * PARTS + part]);
      m = m_new;
    }
  }
  if (qi < seq_len) {
    const float inv = 1.f / l;
#pragma unroll
    for (int i = 0; i < DP; ++i) o[q_off + i * PARTS + part] = __float2bfloat16(acc[i] * inv);
  }
}

torch::Tensor run(torch::Tensor q, torch::Tensor k, torch::Tensor v) {
  TORCH_CHECK(q.is_cuda() && q.scalar_type() == torch::kBFloat16, "q: bf16 CUDA tensor");
  auto qc = q.contiguous();
  auto kc = k.contiguous();
  auto vc = v.contiguous();
  const int batch = qc.size(0), n_q_heads = qc.size(1), seq_len = qc.size(2), head_dim = qc.size(3);
  const int group = n_q_heads / kc.size(1);
  auto o = torch::empty_like(qc);
  if ((long long)batch * n_q_heads * seq_len == 0) return o;
  dim3 grid((seq_len + ROWS - 1) / ROWS, batch * n_q_heads);
  const float scale = 1.f / sqrtf((float)head_dim);
  auto stream = at::cuda::getCurrentCUDAStream();
  auto qp = reinterpret_cast<const __nv_bfloat16*>(qc.data_ptr());
  auto kp = reinterpret_cast<const __nv_bfloat16*>(kc.data_ptr());
  auto vp = reinterpret_cast<const __nv_bfloat16*>(vc.data_ptr());
  auto op = reinterpret_cast<__nv_bfloat16*>(o.data_ptr());
  if (head_dim == 128) {
    attn_causal<128><<<grid, THREADS, 0, stream>>>(qp, kp, vp, op, seq_len, n_q_heads, group, scale);
  } else if (head_dim == 64) {
    attn_causal<64><<<grid, THREADS, 0, stream>>>(qp, kp, vp, op, seq_len, n_q_heads, group, scale);
  } else {
    TORCH_CHECK(false, "this seed handles head_dim 64 and 128, got ", head_dim);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return o;
}
