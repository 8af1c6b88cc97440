// Batch assembly kernels: pack ragged requests into one batch buffer and scatter batch
// outputs back to per-request buffers. NumPy twins: gt_serve/backends/numpy_backend.py.
//
// Layout (shared with the NumPy twin): request i owns rows
// [row_offsets[i], row_offsets[i + 1]) of the batch; row_offsets has n_requests + 1 entries.
// A row is `row_bytes` bytes (prod(trailing shape) * itemsize), so every kernel is generic over
// the element type: it copies bytes, in 16/8/4-byte words when both ends are aligned.
//
// Launch shape: grid = (x blocks striding over one request's bytes or rows, y blocks striding
// over requests), any block size (256 is a good default). Compiles with NVRTC (CuPy RawModule)
// and nvcc: no headers.

template <typename Word>
__device__ __forceinline__ void gt_copy_words(unsigned char* __restrict__ dst,
                                              const unsigned char* __restrict__ src,
                                              long long nbytes, long long tid,
                                              long long nthreads)
{
    const long long nwords = nbytes / (long long)sizeof(Word);
    const Word* __restrict__ s = reinterpret_cast<const Word*>(src);
    Word* __restrict__ d = reinterpret_cast<Word*>(dst);
    for (long long i = tid; i < nwords; i += nthreads) {
        d[i] = s[i];
    }
    for (long long i = nwords * (long long)sizeof(Word) + tid; i < nbytes; i += nthreads) {
        dst[i] = src[i];
    }
}

// Copy nbytes with threads tid, tid + nthreads, ...; the widest word both pointers allow.
__device__ __forceinline__ void gt_copy_bytes(unsigned char* dst, const unsigned char* src,
                                              long long nbytes, long long tid,
                                              long long nthreads)
{
    const unsigned long long both =
        reinterpret_cast<unsigned long long>(dst) | reinterpret_cast<unsigned long long>(src);
    if ((both & 15ull) == 0ull) {
        gt_copy_words<uint4>(dst, src, nbytes, tid, nthreads);
    } else if ((both & 7ull) == 0ull) {
        gt_copy_words<unsigned long long>(dst, src, nbytes, tid, nthreads);
    } else if ((both & 3ull) == 0ull) {
        gt_copy_words<unsigned int>(dst, src, nbytes, tid, nthreads);
    } else {
        gt_copy_words<unsigned char>(dst, src, nbytes, tid, nthreads);
    }
}

// batch[row_offsets[i] * row_bytes ...] <- *src_ptrs[i], for every request i.
extern "C" __global__ void gt_pack(const unsigned long long* __restrict__ src_ptrs,
                                   const long long* __restrict__ row_offsets,
                                   int n_requests, long long row_bytes,
                                   unsigned char* __restrict__ batch)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nthreads = (long long)gridDim.x * blockDim.x;
    for (int req = blockIdx.y; req < n_requests; req += gridDim.y) {
        const long long first = row_offsets[req] * row_bytes;
        const long long nbytes = row_offsets[req + 1] * row_bytes - first;
        const unsigned char* src = reinterpret_cast<const unsigned char*>(src_ptrs[req]);
        gt_copy_bytes(batch + first, src, nbytes, tid, nthreads);
    }
}

// *dst_ptrs[i] <- batch[row_offsets[i] * row_bytes ...], for every request i.
extern "C" __global__ void gt_scatter(const unsigned long long* __restrict__ dst_ptrs,
                                      const long long* __restrict__ row_offsets,
                                      int n_requests, long long row_bytes,
                                      const unsigned char* __restrict__ batch)
{
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nthreads = (long long)gridDim.x * blockDim.x;
    for (int req = blockIdx.y; req < n_requests; req += gridDim.y) {
        const long long first = row_offsets[req] * row_bytes;
        const long long nbytes = row_offsets[req + 1] * row_bytes - first;
        unsigned char* dst = reinterpret_cast<unsigned char*>(dst_ptrs[req]);
        gt_copy_bytes(dst, batch + first, nbytes, tid, nthreads);
    }
}

// Requests shaped [n_i, L_i, *rest] -> batch [sum n_i, max_len, *rest]. `inner_bytes` is
// prod(rest) * itemsize (bytes per position on axis 1); positions L_i..max_len-1 of each row
// are filled with the element whose little-endian bytes are the low `elem_bytes` of pad_bits.
// Blocks stride over rows (x) and requests (y); the threads of a block share one row.
extern "C" __global__ void gt_pack_pad(const unsigned long long* __restrict__ src_ptrs,
                                       const long long* __restrict__ row_offsets,
                                       const long long* __restrict__ src_lens,
                                       int n_requests, long long max_len,
                                       long long inner_bytes, int elem_bytes,
                                       unsigned long long pad_bits,
                                       unsigned char* __restrict__ batch)
{
    const long long dst_row_bytes = max_len * inner_bytes;
    for (int req = blockIdx.y; req < n_requests; req += gridDim.y) {
        const long long first_row = row_offsets[req];
        const long long n_rows = row_offsets[req + 1] - first_row;
        const long long src_row_bytes = src_lens[req] * inner_bytes;
        const unsigned char* src = reinterpret_cast<const unsigned char*>(src_ptrs[req]);
        for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
            unsigned char* dst = batch + (first_row + row) * dst_row_bytes;
            gt_copy_bytes(dst, src + row * src_row_bytes, src_row_bytes, threadIdx.x,
                          blockDim.x);
            for (long long b = src_row_bytes + threadIdx.x; b < dst_row_bytes;
                 b += blockDim.x) {
                const int byte_in_elem = (int)((b - src_row_bytes) % elem_bytes);
                dst[b] = (unsigned char)(pad_bits >> (8 * byte_in_elem));
            }
        }
    }
}
