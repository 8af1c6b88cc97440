// Balanced-policy scoring over a large resource tensor (one thread per row).
// NumPy twin: gt_serve/backends/scoring.py::numpy_score (same inputs, same outputs).
//
// Pass 1, gt_score_latency: predicted latency of one new request on each row, +inf where the row
// is not viable (dead, unhealthy, not enough free memory, queue full).
// Host: best = min(pred); bound = latency bound from best, eps and the SLO (scoring.latency_bound_s).
// Pass 2, gt_score_balanced: marginal energy where pred <= bound, +inf elsewhere; the router takes
// the argmin and breaks ties on load.
// No headers: CuPy compiles this with NVRTC. +inf as a bit pattern.
#define GT_INF __longlong_as_double(0x7ff0000000000000LL)

extern "C" __global__ void gt_score_latency(
    const unsigned char* __restrict__ alive,
    const unsigned char* __restrict__ healthy,
    const unsigned char* __restrict__ parked,
    const double* __restrict__ free_mem_bytes,
    const double* __restrict__ queue_depth,
    const double* __restrict__ queue_limit,
    const double* __restrict__ ready_at_s,
    const double* __restrict__ service_s,
    const double* __restrict__ link_s,
    const double* __restrict__ wake_s,
    double now_s,
    double mem_bytes,
    long long n,
    double* __restrict__ out_pred_s)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        bool viable = alive[i] && healthy[i] && free_mem_bytes[i] >= mem_bytes
                      && queue_depth[i] < queue_limit[i];
        // the same sums in the same order as scoring.py (base_latency_s, predict_latency_s)
        double base = service_s[i] + link_s[i] + (parked[i] ? wake_s[i] : 0.0);
        double pred = fmax(ready_at_s[i] - now_s, 0.0) + base;
        out_pred_s[i] = viable ? pred : GT_INF;
    }
}

extern "C" __global__ void gt_score_balanced(
    const double* __restrict__ pred_s,
    const unsigned char* __restrict__ parked,
    const double* __restrict__ marginal_j,
    const double* __restrict__ link_j,
    const double* __restrict__ wake_j,
    double bound_s,
    long long n,
    double* __restrict__ out_score)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) {
        double energy = marginal_j[i] + link_j[i] + (parked[i] ? wake_j[i] : 0.0);
        out_score[i] = pred_s[i] <= bound_s ? energy : GT_INF;
    }
}
