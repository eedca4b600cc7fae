// myops::RMSNorm on CPUExecutionProvider: float32, vectorised (kernels/rms_norm.h), whole rows
// split over ORT's intra-op thread pool. The kernel keeps only the node's epsilon and name.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cpu/ops.h"
#include "cpu/spans.h"
#include "rms_norm.h"
#include "rms_norm_op_base.h"

namespace myops {
namespace cpu {
namespace {

MYOPS_BUILD_INFO(kOpInfo, "myops-op: domain=" MYOPS_DOMAIN " op=" MYOPS_RMS_NORM_NAME
                          " since=1 provider=CPUExecutionProvider types=float32");

struct RMSNormKernel {
  float epsilon;
  std::string node;

  OrtStatusPtr ComputeV2(OrtKernelContext* raw_context) const {
    return GuardStatus([&] {
      Ort::KernelContext context{raw_context};
      const Ort::ConstValue x = context.GetInput(0);
      const Ort::ConstValue scale = context.GetInput(1);
      RowShape rows;
      if (Ort::Status status = ReadRowShape(x, scale, node, &rows); !status.IsOK()) return status;
      Ort::UnownedValue y = context.GetOutput(0, rows.shape);
      struct Job {
        const float* x;
        const float* w;
        float* y;
        int64_t rows, cols, per_task;
        float eps;
      } job{x.GetTensorData<float>(), scale.GetTensorData<float>(), y.GetTensorMutableData<float>(), rows.rows,
            rows.cols, std::max<int64_t>(1, kChunk / std::max<int64_t>(rows.cols, 1)), epsilon};
      const auto tasks = static_cast<size_t>((job.rows + job.per_task - 1) / job.per_task);
      if (tasks <= 1) {
        rms_norm::forward_rows(job.x, job.w, job.y, job.rows, job.cols, job.eps);
        return Ort::Status{nullptr};
      }
      context.ParallelFor(
          [](void* data, size_t task) {
            const auto* j = static_cast<const Job*>(data);
            const int64_t begin = static_cast<int64_t>(task) * j->per_task;
            const int64_t count = std::min(j->per_task, j->rows - begin);
            rms_norm::forward_rows(j->x + begin * j->cols, j->w, j->y + begin * j->cols, count, j->cols, j->eps);
          },
          tasks, 0, &job);
      return Ort::Status{nullptr};
    });
  }
};

struct RMSNormOp : RMSNormOpBase<RMSNormOp, RMSNormKernel, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT> {
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
};

void RegisterRMSNorm(Ort::CustomOpDomain& domain) {
  static const RMSNormOp rms_norm_op;
  domain.Add(&rms_norm_op);
}

MYOPS_REGISTER_OP(kCpu, RegisterRMSNorm);

}  // namespace
}  // namespace cpu
}  // namespace myops
