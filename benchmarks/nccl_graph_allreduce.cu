// Single-process NCCL allreduce timed in CUDA graphs, the way nccl-tests' all_reduce_perf -g N -G 1 does it:
// one thread drives every GPU (ncclCommInitAll), `iters` allreduces per GPU are captured into one graph per GPU
// inside ncclGroupStart/End, the graphs are launched `launches` times, and time per allreduce =
// elapsed / (iters * launches). Used beside the runtime suite (one process per GPU) to tell whether a gap to
// nccl-tests comes from the multi-process set-up or from the machine. Data: bf16, sum.
//
// Build: nvcc -O2 -o nccl_graph_allreduce nccl_graph_allreduce.cu -I<nccl>/include -L<nccl>/lib -l:libnccl.so.2
// Run:   ./nccl_graph_allreduce [ngpus=2] [iters=122] [launches=20] [sizes in bytes...]
#include <cuda_runtime.h>
#include <nccl.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); exit(1); } } while (0)
#define NK(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { printf("NCCL %s at %s:%d\n", ncclGetErrorString(r), __FILE__, __LINE__); exit(1); } } while (0)

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2, iters = argc > 2 ? atoi(argv[2]) : 122, launches = argc > 3 ? atoi(argv[3]) : 20;
  std::vector<size_t> sizes;
  for (int i = 4; i < argc; i++) sizes.push_back(strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {32768, 43008, 65536, 1 << 20};
  std::vector<int> devs(n);
  for (int i = 0; i < n; i++) devs[i] = i;
  std::vector<ncclComm_t> comms(n);
  NK(ncclCommInitAll(comms.data(), n, devs.data()));
  int ver; ncclGetVersion(&ver);
  printf("# NCCL %d, %d GPUs in one process, %d allreduces per graph, %d graph launches, bf16 sum\n", ver, n, iters, launches);
  printf("# %10s %12s %12s %12s %12s\n", "bytes", "graph_us", "algbw_GB/s", "busbw_GB/s", "eager_us");
  size_t maxb = 0; for (auto s : sizes) maxb = s > maxb ? s : maxb;
  std::vector<void*> sb(n), rb(n); std::vector<cudaStream_t> st(n);
  for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaMalloc(&sb[i], maxb)); CK(cudaMalloc(&rb[i], maxb)); CK(cudaMemset(sb[i], 0, maxb)); CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking)); }
  for (size_t bytes : sizes) {
    size_t count = bytes / 2;
    // eager, for reference
    for (int w = 0; w < 5; w++) { NK(ncclGroupStart()); for (int i = 0; i < n; i++) NK(ncclAllReduce(sb[i], rb[i], count, ncclBfloat16, ncclSum, comms[i], st[i])); NK(ncclGroupEnd()); }
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaStreamSynchronize(st[i])); }
    cudaEvent_t e0, e1; CK(cudaSetDevice(0)); CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    CK(cudaEventRecord(e0, st[0]));
    for (int k = 0; k < iters; k++) { NK(ncclGroupStart()); for (int i = 0; i < n; i++) NK(ncclAllReduce(sb[i], rb[i], count, ncclBfloat16, ncclSum, comms[i], st[i])); NK(ncclGroupEnd()); }
    CK(cudaSetDevice(0)); CK(cudaEventRecord(e1, st[0])); CK(cudaEventSynchronize(e1));
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaStreamSynchronize(st[i])); }
    float eager_ms; CK(cudaEventElapsedTime(&eager_ms, e0, e1));
    // graphs: one per GPU, captured together as nccl-tests does
    std::vector<cudaGraph_t> g(n); std::vector<cudaGraphExec_t> ge(n);
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaStreamBeginCapture(st[i], cudaStreamCaptureModeRelaxed)); }
    for (int k = 0; k < iters; k++) { NK(ncclGroupStart()); for (int i = 0; i < n; i++) NK(ncclAllReduce(sb[i], rb[i], count, ncclBfloat16, ncclSum, comms[i], st[i])); NK(ncclGroupEnd()); }
    for (int i = 0; i < n; i++) CK(cudaStreamEndCapture(st[i], &g[i]));  // end every capture before instantiating
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaGraphInstantiate(&ge[i], g[i], 0)); }
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaGraphLaunch(ge[i], st[i])); }
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaStreamSynchronize(st[i])); }
    CK(cudaSetDevice(0)); CK(cudaEventRecord(e0, st[0]));
    for (int l = 0; l < launches; l++) for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaGraphLaunch(ge[i], st[i])); }
    CK(cudaSetDevice(0)); CK(cudaEventRecord(e1, st[0])); CK(cudaEventSynchronize(e1));
    for (int i = 0; i < n; i++) { CK(cudaSetDevice(i)); CK(cudaStreamSynchronize(st[i])); }
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = ms * 1000.0 / ((double)iters * launches), algbw = bytes / (us * 1e-6) / 1e9;
    printf("  %10zu %12.2f %12.2f %12.2f %12.2f\n", bytes, us, algbw, algbw * 2.0 * (n - 1) / n, eager_ms * 1000.0 / iters);
    for (int i = 0; i < n; i++) { CK(cudaGraphExecDestroy(ge[i])); CK(cudaGraphDestroy(g[i])); }
  }
  for (int i = 0; i < n; i++) ncclCommDestroy(comms[i]);
  return 0;
}
