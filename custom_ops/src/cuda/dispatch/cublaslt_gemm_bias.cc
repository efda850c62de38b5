#include "cuda/dispatch/cublaslt_gemm_bias.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <limits>

#include <cstring>
#include <tuple>

#include <cublasLt.h>

namespace onnxfuse::cuda {

// The run-time library is the one of the CUDA major this library is built for (ORT's CUDA provider of that
// major loads it); headers of another major would describe another ABI.
static_assert(CUBLAS_VER_MAJOR == CUDART_VERSION / 1000,
              "the cuBLAS headers (cmake/cublas.cmake) must be of the CUDA toolkit's major version");

namespace {

#define ONNXFUSE_STR2(x) #x
#define ONNXFUSE_STR(x) ONNXFUSE_STR2(x)
constexpr const char* kLibraryName = "libcublasLt.so." ONNXFUSE_STR(CUBLAS_VER_MAJOR);

// The largest workspace offered to the heuristic. cuBLASLt's Hopper kernels ask for up to 32 MiB (split-K
// and stream-K reductions); the plan allocates only what the chosen algorithm needs, from ORT's allocator.
constexpr uint64_t kMaxWorkspaceBytes = uint64_t{32} << 20;

// Problems of at most this many multiply-adds time the heuristic's first kCandidates answers (kTimedRuns runs
// each after one warm-up, in kTimingRounds rounds) on their first call and keep the fastest. 16x4096x16384 is
// 2^30: runs of such problems are short enough that timing them costs a first call milliseconds, once
// (bench/results/cuda_kernel_never_slower_h200.md, "The fallback times cuBLASLt's candidates"). Larger problems
// keep the heuristic's first answer: their fallback cells measured well ahead of ORT
// (bench/results/cuda_kernel_unaligned_staged_h200.json), and timing them would cost tens of milliseconds on a
// first call.
constexpr int64_t kTimedMaxMultiplyAdds = int64_t{1} << 31;
constexpr int kCandidates = 8;
// Below this many rows of a W of at least kPaddedCandidateMinWeights, the heuristic's answers for
// kPaddedCandidateRows rows join the timed candidates where cuBLASLt accepts them for the rows asked
// (cublasLtMatmulAlgoCheck): reading such a W, its answers for few rows are not its best kernels, while its
// answers for 64 rows run those rows near ORT's MatMul on W [K, N] (fp32 TF32 2-16x4096x16384, W [N, K]:
// lab/kernels/NOTES.md, "The fallback's candidates for few rows"; lab/results/cublas_fp32_few_rows_h200.txt).
// Smaller problems keep their own answers: with the others added, timing noise picked slower kernels for 16-bit
// 1-16 rows of 768x3072 and 1024x4096 (the same section).
constexpr int64_t kPaddedCandidateRows = 64;
constexpr int64_t kPaddedCandidateMinWeights = int64_t{1} << 25;
constexpr int kTimedRuns = 3;
// A candidate's runs are timed again, more of them, until they take at least this long: event timing of a
// few microseconds is noise.
constexpr float kMinTimedMs = 0.25f;
constexpr int kMaxTimedRuns = 64;
// Candidates are timed in this many interleaved rounds, each keeping its fastest (settle()).
constexpr int kTimingRounds = 3;
// Timing noise must not make two sessions of one model pick different algorithms (their results can differ
// in the last bits): the heuristic's first answer is left only for a candidate at least kSwitchGain faster,
// and among candidates within kTieBand of the fastest the heuristic's order decides. The bar was a larger gain
// before: at fp32 8-16x4096x16384 the 64-row kernel's gain over the first answer sat astride it in every
// session, so sessions kept either (lab/results/fallback_settle_times_h200.txt).
constexpr float kSwitchGain = 0.95f;
constexpr float kTieBand = 1.03f;

// The index to keep, given each candidate's time (infinity where it did not run), in the heuristic's order.
size_t ChooseTimed(const std::vector<float>& ms) {
  const size_t fastest = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  if (!(ms[fastest] <= kSwitchGain * ms[0])) return 0;  // (nothing ran: every time infinite, the loop gives 0)
  size_t i = 0;
  while (!(ms[i] <= kTieBand * ms[fastest])) ++i;
  return i;
}

// The functions used here, typed by the header's own declarations, resolved once per process.
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetStatusString) status_string = nullptr;
  decltype(&cublasLtMatmulDescInit_internal) matmul_desc_init = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) matmul_desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutInit_internal) layout_init = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoCapGetAttribute) algo_cap = nullptr;
  decltype(&cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string unavailable;  // empty when every function resolved
};

template <class Fn>
bool Resolve(void* library, const char* name, Fn* fn, std::string* unavailable) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *unavailable = std::string(kLibraryName) + " has no " + name;
  return *fn != nullptr;
}

const CublasLt& Library() {
  static const CublasLt lt = [] {
    CublasLt t;
    // RTLD_LOCAL: its symbols stay out of the global namespace; RTLD_NOW: a missing symbol fails here, not
    // inside a call. Never closed: ORT keeps it loaded anyway, and handles may outlive any one session.
    void* library = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      t.unavailable = std::string("cannot load ") + kLibraryName + ": " + (why ? why : "unknown dlopen error");
      return t;
    }
    std::string& u = t.unavailable;
    (void)(Resolve(library, "cublasLtCreate", &t.create, &u) && Resolve(library, "cublasLtDestroy", &t.destroy, &u) &&
           Resolve(library, "cublasLtGetStatusString", &t.status_string, &u) &&
           Resolve(library, "cublasLtMatmulDescInit_internal", &t.matmul_desc_init, &u) &&
           Resolve(library, "cublasLtMatmulDescSetAttribute", &t.matmul_desc_set, &u) &&
           Resolve(library, "cublasLtMatrixLayoutInit_internal", &t.layout_init, &u) &&
           Resolve(library, "cublasLtMatmulPreferenceCreate", &t.preference_create, &u) &&
           Resolve(library, "cublasLtMatmulPreferenceDestroy", &t.preference_destroy, &u) &&
           Resolve(library, "cublasLtMatmulPreferenceSetAttribute", &t.preference_set, &u) &&
           Resolve(library, "cublasLtMatmulAlgoGetHeuristic", &t.heuristic, &u) &&
           Resolve(library, "cublasLtMatmulAlgoCapGetAttribute", &t.algo_cap, &u) &&
           Resolve(library, "cublasLtMatmulAlgoCheck", &t.algo_check, &u) &&
           Resolve(library, "cublasLtMatmul", &t.matmul, &u));
    return t;
  }();
  return lt;
}

std::string StatusText(const CublasLt& lt, const char* what, cublasStatus_t s) {
  return std::string(what) + " failed: " + lt.status_string(s) + " (cublasStatus_t " + std::to_string(static_cast<int>(s)) + ")";
}

cudaDataType_t DataType(DType d) {
  switch (d) {
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat32: break;
  }
  return CUDA_R_32F;
}

// The largest power of two (at most 256, cuBLASLt's default assumption) that divides the address.
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// The descriptors of one call, in caller-owned storage (cublasLt*Init, not *Create): no host allocation, so
// the call path stays capturable and allocation-free after the first call.
//
// Row-major Y [M, N] is column-major Yᵀ [N, M], and Yᵀ = op(W)ᵀ·Xᵀ, so cuBLASLt's A is W and its B is X:
//   A: transB=1: W [N, K] row-major = column-major K x N (ld K), op T;  transB=0: W [K, N] = column-major N x K
//      (ld N), op N;
//   B: X [M, K] row-major = column-major K x M (ld K), op N;
//   D: column-major N x M (ld N); the bias epilogue adds bias[row] = B[n] to every column, i.e. to every row of Y.
struct Descriptors {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

cublasStatus_t Describe(const CublasLt& lt, const GemmGeluArgs& args, bool fp32_product, Descriptors* desc) {
  const cudaDataType_t type = DataType(args.dtype);
  // fp32_product: 16-bit A and B, float32 D (cuBLASLt's "HSS"/"BSS" configurations), no epilogue.
  const cudaDataType_t d_type = fp32_product ? CUDA_R_32F : type;
  const bool bias = args.bias != nullptr && !fp32_product;
  // fp32 accumulation for every type; float32 on TF32 Tensor Cores exactly where the node allows TF32, as
  // ORT's MatMul does, else full fp32 (so this path is as accurate as ORT's own).
  const cublasComputeType_t compute =
      args.dtype == DType::kFloat32 && args.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasStatus_t s = lt.matmul_desc_init(&desc->op, sizeof(desc->op), compute, CUDA_R_32F);
  const cublasOperation_t trans_a = args.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  // Bias of D's type: CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's default, left as it is.
  const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.matmul_desc_set(&desc->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a));
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.matmul_desc_set(&desc->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b));
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.matmul_desc_set(&desc->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (s == CUBLAS_STATUS_SUCCESS && bias) {
    s = lt.matmul_desc_set(&desc->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias, sizeof(args.bias));
  }
  const uint64_t M = static_cast<uint64_t>(args.M), N = static_cast<uint64_t>(args.N), K = static_cast<uint64_t>(args.K);
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = args.trans_b ? lt.layout_init(&desc->a, sizeof(desc->a), type, K, N, args.K)
                     : lt.layout_init(&desc->a, sizeof(desc->a), type, N, K, args.N);
  }
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_init(&desc->b, sizeof(desc->b), type, K, M, args.K);
  if (s == CUBLAS_STATUS_SUCCESS) s = lt.layout_init(&desc->d, sizeof(desc->d), d_type, N, M, args.N);
  return s;
}

// Sets the current device for the scope (cuBLASLt binds a handle to the device current at its creation).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device && cudaSetDevice(device) == cudaSuccess) {
      restore_ = true;
    }
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool restore_ = false;
};

}  // namespace

struct CublasLtGemmBias::Choice {
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
    size_t workspace_bytes;
  };
  std::vector<Candidate> candidates;  // the heuristic's answers, its best first
  size_t max_workspace_bytes = 0;     // the most any candidate needs
  Candidate chosen{};                 // written once, before `settled` is set
  std::atomic<bool> settled{false};
};

bool CublasLtAvailable(std::string* why) {
  const CublasLt& lt = Library();
  if (why != nullptr) *why = lt.unavailable;
  return lt.unavailable.empty();
}

struct CublasLtGemmBias::Choices {
  std::mutex mutex;
  std::map<Key, std::unique_ptr<Choice>> map;
};

CublasLtGemmBias::Choices& CublasLtGemmBias::process_choices() {
  static Choices* const choices = new Choices;  // never destroyed: kernels may outlive static destruction
  return *choices;
}

bool CublasLtGemmBias::Key::operator<(const Key& o) const {
  return std::tie(device, M, N, K, dtype, trans_b, bias, tf32, fp32_product, align_x, align_w, align_y, align_bias) <
         std::tie(o.device, o.M, o.N, o.K, o.dtype, o.trans_b, o.bias, o.tf32, o.fp32_product, o.align_x, o.align_w, o.align_y,
                  o.align_bias);
}

CublasLtGemmBias::Key CublasLtGemmBias::key_of(const GemmGeluArgs& a, bool fp32_product) const {
  // The fp32 product goes to the caller's workspace, which its allocator aligns to 256 bytes.
  return Key{device_, a.M, a.N, a.K, static_cast<int>(a.dtype), a.trans_b, a.bias != nullptr && !fp32_product,
             a.dtype == DType::kFloat32 && a.allow_tf32, fp32_product, Alignment(a.x), Alignment(a.w),
             fp32_product ? 256u : Alignment(a.y), a.bias != nullptr && !fp32_product ? Alignment(a.bias) : 256u};
}

CublasLtGemmBias::CublasLtGemmBias(int device) : device_(device) {}

CublasLtGemmBias::~CublasLtGemmBias() {
  if (handle_ != nullptr) {
    DeviceScope scope(device_);
    Library().destroy(static_cast<cublasLtHandle_t>(handle_));
  }
}

bool CublasLtGemmBias::plan(const GemmGeluArgs& args, bool fp32_product, Plan* out, std::string* error) {
  const CublasLt& lt = Library();
  if (!lt.unavailable.empty()) {
    *error = lt.unavailable;
    return false;
  }
  if (args.M <= 0 || args.N <= 0 || args.K <= 0) {
    *error = "cuBLASLt path needs M, N, K > 0";
    return false;
  }
  if (fp32_product && args.dtype == DType::kFloat32) {
    *error = "the float32 product without bias is for 16-bit nodes";
    return false;
  }
  const Key key = key_of(args, fp32_product);
  void* handle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle_ == nullptr) {
      DeviceScope scope(device_);
      cublasLtHandle_t h = nullptr;
      const cublasStatus_t s = lt.create(&h);
      if (s != CUBLAS_STATUS_SUCCESS) {
        *error = StatusText(lt, "cublasLtCreate", s);
        return false;
      }
      handle_ = h;
    }
    handle = handle_;
  }
  Choices& choices = process_choices();
  std::lock_guard<std::mutex> lock(choices.mutex);
  if (auto it = choices.map.find(key); it != choices.map.end()) {
    Choice* c = it->second.get();
    *out = Plan{handle, c, c->settled.load(std::memory_order_relaxed) ? c->chosen.workspace_bytes : c->max_workspace_bytes,
                fp32_product};
    return true;
  }
  // A problem's first call in this process: ask the heuristic for its candidates.
  Descriptors desc;
  cublasStatus_t s = Describe(lt, args, fp32_product, &desc);
  if (s != CUBLAS_STATUS_SUCCESS) {
    *error = StatusText(lt, "describing the GEMM", s);
    return false;
  }
  cublasLtMatmulPreference_t preference = nullptr;
  s = lt.preference_create(&preference);
  if (s != CUBLAS_STATUS_SUCCESS) {
    *error = StatusText(lt, "cublasLtMatmulPreferenceCreate", s);
    return false;
  }
  // Only algorithms that work at these pointers' alignments (views at odd offsets, K or N odd).
  const uint32_t align[4] = {key.align_w, key.align_x, key.align_y, key.align_y};  // A = W, B = X, C, D = Y
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  s = lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kMaxWorkspaceBytes,
                        sizeof(kMaxWorkspaceBytes));
  for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i) {
    s = lt.preference_set(preference, align_attr[i], &align[i], sizeof(align[i]));
  }
  const int wanted = args.M <= kTimedMaxMultiplyAdds / args.N / args.K ? kCandidates : 1;  // no overflow
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = lt.heuristic(static_cast<cublasLtHandle_t>(handle), &desc.op, &desc.a, &desc.b, &desc.d, &desc.d, preference,
                     wanted, results, &found);
  }
  auto choice = std::make_unique<Choice>();
  // The candidates of the first answer's numerical kind (where cuBLASLt tells it), in the heuristic's order.
  uint64_t kind = 0;
  bool kind_known = false;
  for (int i = 0; i < found && s == CUBLAS_STATUS_SUCCESS; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    uint64_t flags = 0;
    size_t written = 0;
    const bool known = lt.algo_cap(&results[i].algo, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &flags, sizeof(flags),
                                   &written) == CUBLAS_STATUS_SUCCESS && written == sizeof(flags);
    if (choice->candidates.empty()) {
      kind = flags;
      kind_known = known;
    } else if (!kind_known || !known || flags != kind) {
      continue;
    }
    choice->candidates.push_back(Choice::Candidate{results[i].algo, results[i].workspaceSize});
    choice->max_workspace_bytes = std::max(choice->max_workspace_bytes, results[i].workspaceSize);
  }
  // Few rows (kPaddedCandidateRows): the answers for more rows, of the same numerical kind, not already there,
  // where cuBLASLt accepts them for this problem; their workspace is what the check says this problem needs.
  if (s == CUBLAS_STATUS_SUCCESS && kind_known && !choice->candidates.empty() && wanted == kCandidates &&
      args.M < kPaddedCandidateRows && args.K * args.N >= kPaddedCandidateMinWeights) {
    GemmGeluArgs padded = args;
    padded.M = kPaddedCandidateRows;
    Descriptors more;
    cublasLtMatmulHeuristicResult_t padded_results[kCandidates] = {};
    int padded_found = 0;
    if (Describe(lt, padded, fp32_product, &more) != CUBLAS_STATUS_SUCCESS ||
        lt.heuristic(static_cast<cublasLtHandle_t>(handle), &more.op, &more.a, &more.b, &more.d, &more.d, preference,
                     kCandidates, padded_results, &padded_found) != CUBLAS_STATUS_SUCCESS) {
      padded_found = 0;  // the problem's own candidates stand
    }
    for (int i = 0; i < padded_found; ++i) {
      const cublasLtMatmulAlgo_t& algo = padded_results[i].algo;
      uint64_t flags = 0;
      size_t written = 0;
      cublasLtMatmulHeuristicResult_t check{};
      const bool same_kind = padded_results[i].state == CUBLAS_STATUS_SUCCESS &&
                             lt.algo_cap(&algo, CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS, &flags, sizeof(flags), &written) ==
                                 CUBLAS_STATUS_SUCCESS && written == sizeof(flags) && flags == kind;
      const bool known = std::any_of(choice->candidates.begin(), choice->candidates.end(), [&](const Choice::Candidate& c) {
        return std::memcmp(&c.algo, &algo, sizeof(algo)) == 0;
      });
      if (!same_kind || known ||
          lt.algo_check(static_cast<cublasLtHandle_t>(handle), &desc.op, &desc.a, &desc.b, &desc.d, &desc.d, &algo, &check) !=
              CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kMaxWorkspaceBytes) {
        continue;
      }
      choice->candidates.push_back(Choice::Candidate{algo, check.workspaceSize});
      choice->max_workspace_bytes = std::max(choice->max_workspace_bytes, check.workspaceSize);
    }
  }
  lt.preference_destroy(preference);
  if (s != CUBLAS_STATUS_SUCCESS || choice->candidates.empty()) {
    *error = s == CUBLAS_STATUS_SUCCESS ? std::string("cuBLASLt has no algorithm for this GEMM")
                                        : StatusText(lt, "cublasLtMatmulAlgoGetHeuristic", s);
    return false;
  }
  if (choice->candidates.size() == 1) {  // nothing to time
    choice->chosen = choice->candidates.front();
    choice->settled.store(true, std::memory_order_release);
  }
  Choice* c = choices.map.emplace(key, std::move(choice)).first->second.get();
  *out = Plan{handle, c, c->settled.load(std::memory_order_relaxed) ? c->chosen.workspace_bytes : c->max_workspace_bytes,
              fp32_product};
  return true;
}

namespace {

// desc is not const: cuBLASLt takes its descriptors by non-const handle.
cublasStatus_t Matmul(const CublasLt& lt, void* handle, Descriptors& desc, const GemmGeluArgs& args,
                      const cublasLtMatmulAlgo_t& algo, void* d, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  // C = D with beta = 0: C is never read, but cuBLASLt wants a C descriptor and pointer.
  return lt.matmul(static_cast<cublasLtHandle_t>(handle), &desc.op, &alpha, args.w, &desc.a, args.x, &desc.b, &beta, d,
                   &desc.d, d, &desc.d, &algo, workspace, workspace_bytes, stream);
}

// Two events for timing on one stream, destroyed with the scope.
class EventPair {
 public:
  EventPair() { ok_ = cudaEventCreate(&start_) == cudaSuccess && cudaEventCreate(&stop_) == cudaSuccess; }
  ~EventPair() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  bool ok() const { return ok_; }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  bool ok_ = false;
};

}  // namespace

bool CublasLtGemmBias::settle(Choice* choice, void* handle, const GemmGeluArgs& args, bool fp32_product, void* d,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream, std::string* error) {
  std::lock_guard<std::mutex> lock(process_choices().mutex);
  if (choice->settled.load(std::memory_order_relaxed)) return true;  // another thread timed it meanwhile
  const CublasLt& lt = Library();
  // Under a capture nothing may synchronize: the heuristic's first answer, as before timing existed.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const bool capturing = cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone;
  size_t best = 0;
  if (!capturing && workspace_bytes >= choice->max_workspace_bytes) {
    Descriptors desc;
    cublasStatus_t s = Describe(lt, args, fp32_product, &desc);
    EventPair events;
    if (s != CUBLAS_STATUS_SUCCESS || !events.ok()) {
      *error = s != CUBLAS_STATUS_SUCCESS ? StatusText(lt, "describing the GEMM", s)
                                          : std::string("cannot create CUDA events to time cuBLASLt's candidates");
      return false;
    }
    // The time of `runs` back-to-back runs of candidate c, in ms; infinity where one did not run.
    auto time_runs = [&](const Choice::Candidate& c, int runs) {
      bool ran = cudaEventRecord(events.start(), stream) == cudaSuccess;
      for (int r = 0; r < runs && ran; ++r) {
        ran = Matmul(lt, handle, desc, args, c.algo, d, workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      }
      float elapsed = 0.0f;
      if (ran && cudaEventRecord(events.stop(), stream) == cudaSuccess && cudaEventSynchronize(events.stop()) == cudaSuccess &&
          cudaEventElapsedTime(&elapsed, events.start(), events.stop()) == cudaSuccess) {
        return elapsed / static_cast<float>(runs);
      }
      return std::numeric_limits<float>::infinity();
    };
    const size_t n = choice->candidates.size();
    std::vector<float> ms(n, std::numeric_limits<float>::infinity());
    std::vector<int> runs(n, 0);  // 0: refused at run time (the warm-up run tells), never timed
    for (size_t i = 0; i < n; ++i) {
      const Choice::Candidate& c = choice->candidates[i];
      if (Matmul(lt, handle, desc, args, c.algo, d, workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS) {
        runs[i] = kTimedRuns;
      }
    }
    // Rounds, each timing every candidate once, and each candidate's best round: a candidate timed once, while
    // the clocks still rose from idle or beside a neighbour's leftovers in L2, could lose to a slower one (bf16
    // 8x768x3072: a slower kernel kept in one grid of three; lab/kernels/NOTES.md, "The fallback's candidates for
    // few rows").
    for (int round = 0; round < kTimingRounds; ++round) {
      for (size_t i = 0; i < n; ++i) {
        if (runs[i] == 0) continue;
        float t = time_runs(choice->candidates[i], runs[i]);
        if (round == 0 && t * static_cast<float>(runs[i]) < kMinTimedMs) {  // too short to time: more runs
          runs[i] = std::min(kMaxTimedRuns, static_cast<int>(kMinTimedMs / std::max(t, 1e-4f)) + 1);
          t = time_runs(choice->candidates[i], runs[i]);
        }
        ms[i] = std::min(ms[i], t);
      }
    }
    best = ChooseTimed(ms);
    // A launch error left by any of the runs would surface in ORT's next CUDA call; report it here instead.
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      *error = std::string("timing cuBLASLt's candidates failed: ") + cudaGetErrorString(e);
      return false;
    }
  }
  choice->chosen = choice->candidates[best];
  choice->settled.store(true, std::memory_order_release);
  return true;
}

bool CublasLtGemmBias::run(const Plan& plan, const GemmGeluArgs& args, void* d, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, std::string* error) {
  const CublasLt& lt = Library();
  if (plan.choice == nullptr || plan.handle == nullptr) {
    *error = "cuBLASLt GEMM run without a plan";
    return false;
  }
  if (!plan.choice->settled.load(std::memory_order_acquire) &&
      !settle(plan.choice, plan.handle, args, plan.fp32_product, d, workspace, workspace_bytes, stream, error)) {
    return false;
  }
  const Choice::Candidate& chosen = plan.choice->chosen;
  if (workspace_bytes < chosen.workspace_bytes) {
    *error = "cuBLASLt GEMM run with " + std::to_string(workspace_bytes) + " bytes of workspace; its algorithm needs " +
             std::to_string(chosen.workspace_bytes);
    return false;
  }
  Descriptors desc;
  cublasStatus_t s = Describe(lt, args, plan.fp32_product, &desc);
  if (s == CUBLAS_STATUS_SUCCESS) s = Matmul(lt, plan.handle, desc, args, chosen.algo, d, workspace, workspace_bytes, stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    *error = StatusText(lt, "cublasLtMatmul", s);
    return false;
  }
  return true;
}

}  // namespace onnxfuse::cuda
