// Floor of a dependent chain of tiny kernels in a CUDA graph, with and without programmatic edges.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)
__global__ void tiny(float* p, int trig) {
  if (trig) asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) p[blockIdx.x] += 1.0f;
}
int main() {
  float* p;
  CK(cudaMalloc(&p, 1 << 20));
  CK(cudaMemset(p, 0, 1 << 20));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int blocks : {1, 132, 1024})
    for (int threads : {32, 256})
      for (int pdl = 0; pdl < 2; ++pdl)
        for (int trig = 0; trig < 2; ++trig) {
          if (!pdl && trig) continue;
          const int n = 500;
          cudaGraph_t g;
          CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < n; ++i) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(blocks);
            cfg.blockDim = dim3(threads);
            cfg.stream = s;
            cudaLaunchAttribute a[1];
            a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            a[0].val.programmaticStreamSerializationAllowed = pdl;
            cfg.attrs = a;
            cfg.numAttrs = 1;
            CK(cudaLaunchKernelEx(&cfg, tiny, p, trig));
          }
          CK(cudaStreamEndCapture(s, &g));
          cudaGraphExec_t ge;
          CK(cudaGraphInstantiate(&ge, g, 0));
          for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
          CK(cudaEventRecord(e0, s));
          for (int i = 0; i < 10; ++i) CK(cudaGraphLaunch(ge, s));
          CK(cudaEventRecord(e1, s));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          std::printf("blocks %4d threads %3d pdl %d trigger %d: %.2f us a kernel\n", blocks,
                      threads, pdl, trig, ms * 1e3 / 10 / n);
          CK(cudaGraphExecDestroy(ge));
          CK(cudaGraphDestroy(g));
        }
  return 0;
}
