// The emulated cuBLAS and cuBLASLt (cmake/cuda_emu/cublas.cc) against a
// naive column-major reference written here: shapes, transposes, leading
// dimensions and batch strides (their padding filled with NaN, which must
// neither be read nor written), beta 0 over NaN, f16 / bf16 operands and
// rounding, the BIAS and GELU epilogues with their auxiliary output, the
// queueing on streams, and the statuses of arguments real cuBLAS refuses.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- Element encodings, written independently of the emulator's ----

size_t SizeOf(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_8I:
      return 1;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    case CUDA_R_64F:
      return 8;
    default:
      return 4;
  }
}

double HalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 31) {
    v = mantissa != 0 ? kNaN : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

// Test values are exact in every type (multiples of 1/8 of magnitude <= 4).
uint16_t ExactHalf(double v) {
  if (std::isnan(v)) return 0x7e00;
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  int exponent;
  const double fraction = std::frexp(std::fabs(v), &exponent);  // [0.5, 1)
  const double mantissa = (fraction * 2 - 1) * 1024;
  EXPECT_EQ(mantissa, std::floor(mantissa)) << v << " is not exact in f16";
  EXPECT_TRUE(exponent - 1 + 15 >= 1 && exponent - 1 + 15 <= 30) << v;
  const auto bits = static_cast<uint16_t>(((exponent - 1 + 15) << 10) | static_cast<int>(mantissa));
  return v < 0 ? static_cast<uint16_t>(bits | 0x8000) : bits;
}

uint16_t ExactBf16(double v) {
  const auto f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (!std::isnan(v)) {
    EXPECT_EQ(bits & 0xffff, 0u) << v << " is not exact in bf16";
  }
  return static_cast<uint16_t>(bits >> 16);
}

double Bf16Value(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

std::vector<unsigned char> Encode(const std::vector<double>& values, cudaDataType_t type) {
  std::vector<unsigned char> bytes(values.size() * SizeOf(type));
  for (size_t i = 0; i < values.size(); ++i) {
    unsigned char* p = bytes.data() + i * SizeOf(type);
    const double v = values[i];
    if (type == CUDA_R_32F) {
      const auto f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (type == CUDA_R_64F) {
      std::memcpy(p, &v, 8);
    } else if (type == CUDA_R_16F || type == CUDA_R_16BF) {
      const uint16_t h = type == CUDA_R_16F ? ExactHalf(v) : ExactBf16(v);
      std::memcpy(p, &h, 2);
    } else {
      const auto i8 = static_cast<int8_t>(std::isnan(v) ? 127 : v);  // i8 has no NaN
      std::memcpy(p, &i8, 1);
    }
  }
  return bytes;
}

std::vector<double> Decode(const std::vector<unsigned char>& bytes, cudaDataType_t type) {
  std::vector<double> values(bytes.size() / SizeOf(type));
  for (size_t i = 0; i < values.size(); ++i) {
    const unsigned char* p = bytes.data() + i * SizeOf(type);
    if (type == CUDA_R_32F) {
      float f;
      std::memcpy(&f, p, 4);
      values[i] = f;
    } else if (type == CUDA_R_64F) {
      std::memcpy(&values[i], p, 8);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      values[i] = type == CUDA_R_16F ? HalfValue(h) : Bf16Value(h);
    }
  }
  return values;
}

// Relative rounding error of one conversion to the output type, doubled.
double Tolerance(cudaDataType_t out) {
  return out == CUDA_R_16F ? std::ldexp(1.0, -10) : out == CUDA_R_16BF ? std::ldexp(1.0, -7) : std::ldexp(1.0, -23);
}

// A device buffer (cudaMalloc) holding `values` in `type`.
class Device {
 public:
  Device(const std::vector<double>& values, cudaDataType_t type) : type_(type), count_(values.size()) {
    const std::vector<unsigned char> bytes = Encode(values, type);
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes.size(), 1)), cudaSuccess);
    if (!bytes.empty()) {
      EXPECT_EQ(cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  void* get() const { return ptr_; }
  std::vector<double> Read() const {
    std::vector<unsigned char> bytes(count_ * SizeOf(type_));
    if (!bytes.empty()) {
      EXPECT_EQ(cudaMemcpy(bytes.data(), ptr_, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return Decode(bytes, type_);
  }

 private:
  void* ptr_ = nullptr;
  cudaDataType_t type_;
  size_t count_;
};

// A matrix in memory: rows x cols, column- or row-major, batched with a
// stride; the elements outside it (padding, gaps) are NaN.
struct Matrix {
  int64_t rows = 0, cols = 0, ld = 0, stride = 0;
  int batch = 1;
  bool row_major = false;
  std::vector<double> values;

  Matrix(int64_t r, int64_t c, int64_t pad, int b = 1, bool rm = false)
      : rows(r), cols(c), ld((rm ? c : r) + pad), batch(b), row_major(rm) {
    stride = ld * (rm ? r : c) + (b > 1 ? 3 : 0);  // a gap of NaN between matrices
    values.assign(static_cast<size_t>(stride * (b - 1) + ld * (rm ? r : c)), kNaN);
  }
  int64_t Index(int b, int64_t r, int64_t c) const { return b * stride + (row_major ? r * ld + c : r + c * ld); }
  double& At(int b, int64_t r, int64_t c) { return values[static_cast<size_t>(Index(b, r, c))]; }
  double At(int b, int64_t r, int64_t c) const { return values[static_cast<size_t>(Index(b, r, c))]; }
  void Fill(std::mt19937& rng, bool integers = false) {
    std::uniform_int_distribution<int> dist(-32, 32);
    for (int b = 0; b < batch; ++b) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) At(b, r, c) = integers ? dist(rng) / 4 : dist(rng) / 8.0;
      }
    }
  }
  // Whether (index) lies outside every batch's rows x cols.
  bool IsPadding(size_t index) const {
    const auto i = static_cast<int64_t>(index);
    const int64_t b = std::min<int64_t>(i / stride, batch - 1);
    const int64_t in = i - b * stride;
    const int64_t major = in / ld, minor = in % ld;
    return row_major ? (major >= rows || minor >= cols) : (major >= cols || minor >= rows);
  }
};

// Checks D's elements against `expected` (same indexing), with `scale`
// bounding each element's magnitudes, and that D's padding is still NaN.
void ExpectMatrix(const Matrix& layout, const std::vector<double>& got, const std::vector<double>& expected,
                  const std::vector<double>& scale, cudaDataType_t type, const std::string& what) {
  ASSERT_EQ(got.size(), layout.values.size());
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 10; ++i) {
    if (layout.IsPadding(i)) {
      if (!std::isnan(got[i])) {
        ADD_FAILURE() << what << ": padding element " << i << " was written: " << got[i];
        ++failures;
      }
      continue;
    }
    const double tolerance = Tolerance(type) * scale[i] + 1e-30;
    if (!(std::fabs(got[i] - expected[i]) <= tolerance)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << expected[i];
      ++failures;
    }
  }
}

double Gelu(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// op(X)(r, c) of batch b.
double Op(const Matrix& x, bool transposed, int b, int64_t r, int64_t c) {
  return transposed ? x.At(b, c, r) : x.At(b, r, c);
}

// Holds a stream's queue until released (on destruction at the latest, so a
// failed assertion cannot leave the stream blocked).
class Gate {
 public:
  explicit Gate(cudaStream_t stream) { EXPECT_EQ(cudaLaunchHostFunc(stream, &Gate::Wait, &open_), cudaSuccess); }
  ~Gate() { Open(); }
  void Open() { open_.store(true); }

 private:
  static void Wait(void* open) {
    while (!static_cast<std::atomic<bool>*>(open)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> open_{false};
};

class CublasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    if (handle_ != nullptr) cublasDestroy(handle_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  std::mt19937 rng_{1234};
};

// ---- cublasGemmStridedBatchedEx ----

struct GemmCase {
  cublasOperation_t ta, tb;
  int m, n, k, batch;
  int pad_a, pad_b, pad_c;  // leading dimensions beyond the stored rows
  cudaDataType_t in, out;
  float alpha, beta;
  bool broadcast_a = false;  // strideA 0: one A for every batch
};

void PrintTo(const GemmCase& t, std::ostream* os) {
  *os << "op " << t.ta << t.tb << " m " << t.m << " n " << t.n << " k " << t.k << " batch " << t.batch << " pads "
      << t.pad_a << "," << t.pad_b << "," << t.pad_c << " types " << t.in << "->" << t.out << " alpha " << t.alpha
      << " beta " << t.beta << (t.broadcast_a ? " strideA 0" : "");
}

class GemmTest : public CublasTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(GemmTest, MatchesReference) {
  const GemmCase& t = GetParam();
  const bool ta = t.ta != CUBLAS_OP_N, tb = t.tb != CUBLAS_OP_N;
  const bool integers = t.in == CUDA_R_8I;
  Matrix a(ta ? t.k : t.m, ta ? t.m : t.k, t.pad_a, t.broadcast_a ? 1 : t.batch);
  Matrix b(tb ? t.n : t.k, tb ? t.k : t.n, t.pad_b, t.batch);
  Matrix c(t.m, t.n, t.pad_c, t.batch);
  a.Fill(rng_, integers);
  b.Fill(rng_, integers);
  if (t.beta != 0) c.Fill(rng_);  // with beta 0, C is all NaN and must not be read

  const Device da(a.values, t.in), db(b.values, t.in), dc(c.values, t.out);
  ASSERT_EQ(cublasGemmStridedBatchedEx(
                handle_, t.ta, t.tb, t.m, t.n, t.k, &t.alpha, da.get(), t.in, static_cast<int>(a.ld),
                t.broadcast_a ? 0 : a.stride, db.get(), t.in, static_cast<int>(b.ld), b.stride, &t.beta, dc.get(),
                t.out, static_cast<int>(c.ld), c.stride, t.batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);

  std::vector<double> expected(c.values.size()), scale(c.values.size());
  for (int batch = 0; batch < t.batch; ++batch) {
    for (int i = 0; i < t.m; ++i) {
      for (int j = 0; j < t.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int p = 0; p < t.k; ++p) {
          const double x = Op(a, ta, t.broadcast_a ? 0 : batch, i, p) * Op(b, tb, batch, p, j);
          sum += x;
          magnitude += std::fabs(x);
        }
        const size_t at = static_cast<size_t>(c.Index(batch, i, j));
        const double c0 = t.beta != 0 ? c.values[at] : 0.0;
        expected[at] = t.alpha * sum + t.beta * c0;
        scale[at] = std::fabs(t.alpha) * magnitude + std::fabs(t.beta * c0);
      }
    }
  }
  ExpectMatrix(c, dc.Read(), expected, scale, t.out, "C");
}

constexpr cudaDataType_t F32 = CUDA_R_32F, F16 = CUDA_R_16F, BF16 = CUDA_R_16BF;
constexpr cublasOperation_t kN = CUBLAS_OP_N, kT = CUBLAS_OP_T;

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Values(GemmCase{kN, kN, 5, 7, 3, 1, 0, 0, 0, F32, F32, 1, 0},
                      GemmCase{kT, kN, 6, 4, 9, 1, 2, 1, 3, F32, F32, 1.5f, 0},
                      GemmCase{kN, kT, 8, 5, 7, 1, 0, 3, 0, F32, F32, 1, 0.5f},
                      GemmCase{kT, kT, 3, 11, 5, 1, 1, 1, 1, F32, F32, -0.75f, 2},
                      GemmCase{CUBLAS_OP_C, kN, 4, 4, 4, 1, 0, 0, 0, F32, F32, 1, 0},  // C is T for reals
                      GemmCase{kN, kT, 4, 6, 5, 3, 1, 2, 1, F32, F32, 1, 0},
                      GemmCase{kT, kN, 7, 3, 8, 4, 0, 0, 2, F16, F32, 1, 0.25f},
                      GemmCase{kN, kN, 9, 10, 6, 2, 1, 0, 0, BF16, F32, 2, 0, true},
                      GemmCase{kN, kT, 12, 9, 17, 2, 0, 1, 1, F16, F16, 1, -1},
                      GemmCase{kT, kT, 10, 13, 6, 1, 3, 0, 2, BF16, BF16, 0.5f, 1},
                      GemmCase{kN, kT, 5, 4, 6, 2, 1, 0, 0, CUDA_R_8I, F32, 1, 0},
                      GemmCase{kN, kN, 131, 67, 129, 1, 1, 2, 3, F32, F32, 1, 0},   // partial row / column blocks
                      GemmCase{kT, kN, 300, 70, 260, 2, 0, 0, 0, BF16, F32, 1, 0},  // split over threads
                      GemmCase{kN, kN, 5, 6, 0, 1, 0, 1, 0, F32, F32, 1, 0.5f},     // k 0: C = beta C
                      GemmCase{kN, kN, 5, 6, 0, 1, 0, 1, 0, F32, F32, 1, 0}));      // k 0, beta 0: zeros

// Half and bf16 outputs round to nearest even, overflow to infinity and
// keep half's subnormals (one element per call: alpha carries the value).
TEST_F(CublasTest, LowPrecisionOutputsRoundToNearestEven) {
  const struct {
    cudaDataType_t type;
    float alpha;
    uint16_t bits;
  } cases[] = {
      {F16, 1 + std::ldexp(1.0f, -11), 0x3c00},                             // tie: to even (down)
      {F16, 1 + 3 * std::ldexp(1.0f, -11), 0x3c02},                         // tie: to even (up)
      {F16, 1 + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20), 0x3c01},     // above the tie
      {F16, 65519.0f, 0x7bff},                                              // the largest half
      {F16, 65520.0f, 0x7c00},                                              // rounds to infinity
      {F16, -1.5f * std::ldexp(1.0f, -24), 0x8002},                         // subnormal tie: to even
      {F16, std::ldexp(1.0f, -25), 0x0000},                                 // half the smallest: to zero
      {BF16, 1 + std::ldexp(1.0f, -8), 0x3f80},                             // tie: to even (down)
      {BF16, 1 + 3 * std::ldexp(1.0f, -8), 0x3f82},                         // tie: to even (up)
      {BF16, -(1 + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -16)), 0xbf81},  // above the tie
  };
  for (const auto& t : cases) {
    const Device one_a({1.0}, t.type), one_b({1.0}, t.type);
    uint16_t* c = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&c), 2), cudaSuccess);
    const float beta = 0;
    ASSERT_EQ(cublasGemmEx(handle_, kN, kN, 1, 1, 1, &t.alpha, one_a.get(), t.type, 1, one_b.get(), t.type, 1, &beta, c,
                           t.type, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    uint16_t bits = 0;
    ASSERT_EQ(cudaMemcpy(&bits, c, 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(bits, t.bits) << "alpha " << t.alpha << (t.type == F16 ? " f16" : " bf16");
    cudaFree(c);
  }
}

// The product runs on the stream: it reads A when it runs, but alpha (a host
// scalar) when the call is made.
TEST_F(CublasTest, QueuedOnTheHandleStream) {
  Matrix a(2, 2, 0), b(2, 2, 0);
  a.values = {1, 2, 3, 4};
  b.values = {1, 0, 0, 1};
  const Device da(a.values, F32), db(b.values, F32), dc(std::vector<double>(4, kNaN), F32);
  Gate gate(stream_);
  float alpha = 2, beta = 0;
  ASSERT_EQ(cublasSgemm(handle_, kN, kN, 2, 2, 2, &alpha, static_cast<float*>(da.get()), 2,
                        static_cast<float*>(db.get()), 2, &beta, static_cast<float*>(dc.get()), 2),
            CUBLAS_STATUS_SUCCESS);
  alpha = 100;
  // Device memory is host memory in the emulator: write A behind the queue.
  static_cast<float*>(da.get())[0] = 10;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(std::isnan(static_cast<const float*>(dc.get())[0])) << "ran before the stream reached it";
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(dc.Read(), (std::vector<double>{20, 4, 6, 8}));
}

// With CUBLAS_POINTER_MODE_DEVICE alpha and beta are read when the product runs.
TEST_F(CublasTest, DevicePointerModeReadsScalarsWhenRun) {
  const Device da({1, 2, 3, 4}, F32), db({1, 0, 0, 1}, F32), dc({1, 1, 1, 1}, F32);
  const Device alpha({1}, F32), beta({0}, F32);
  ASSERT_EQ(cublasSetPointerMode(handle_, CUBLAS_POINTER_MODE_DEVICE), CUBLAS_STATUS_SUCCESS);
  Gate gate(stream_);
  ASSERT_EQ(
      cublasSgemm(handle_, kN, kN, 2, 2, 2, static_cast<float*>(alpha.get()), static_cast<float*>(da.get()), 2,
                  static_cast<float*>(db.get()), 2, static_cast<float*>(beta.get()), static_cast<float*>(dc.get()), 2),
      CUBLAS_STATUS_SUCCESS);
  static_cast<float*>(alpha.get())[0] = 3;
  static_cast<float*>(beta.get())[0] = 1;
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(dc.Read(), (std::vector<double>{4, 7, 10, 13}));
}

// Refused at once, with real cuBLAS's statuses, and nothing queued.
TEST_F(CublasTest, InvalidArgumentsAreRefused) {
  const Device da(std::vector<double>(64, 1), F32), db(std::vector<double>(64, 1), F32);
  const Device dc(std::vector<double>(64, 7), F32);
  const float alpha = 1, beta = 0;
  const auto gemm = [&](cublasHandle_t h, cublasOperation_t ta, int m, int n, int k, int lda, int ldb, int ldc,
                        int batch = 1, cudaDataType_t at = F32, cudaDataType_t ct = F32,
                        cublasComputeType_t compute = CUBLAS_COMPUTE_32F, cublasGemmAlgo_t algo = CUBLAS_GEMM_DEFAULT) {
    return cublasGemmStridedBatchedEx(h, ta, kN, m, n, k, &alpha, da.get(), at, lda, 0, db.get(), F32, ldb, 0, &beta,
                                      dc.get(), ct, ldc, 0, batch, compute, algo);
  };
  EXPECT_EQ(gemm(nullptr, kN, 2, 2, 2, 2, 2, 2), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(gemm(handle_, kN, -1, 2, 2, 2, 2, 2), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(handle_, kN, 2, 2, -1, 2, 2, 2), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(handle_, kN, 4, 2, 2, 3, 2, 4), CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(gemm(handle_, kT, 4, 2, 3, 2, 3, 4), CUBLAS_STATUS_INVALID_VALUE);  // transposed: lda < k
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 4, 2, 3, 2), CUBLAS_STATUS_INVALID_VALUE);  // ldb < k
  EXPECT_EQ(gemm(handle_, kN, 4, 2, 2, 4, 2, 3), CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, -1), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(handle_, CUBLAS_OP_CONJG, 2, 2, 2, 2, 2, 2), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, 1, F32, F32, CUBLAS_COMPUTE_32F, static_cast<cublasGemmAlgo_t>(50)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, 1, F16), CUBLAS_STATUS_NOT_SUPPORTED);  // A f16, B f32
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, 1, F32, F16), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, 1, F32, F32, CUBLAS_COMPUTE_16F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasSetMathMode(handle_, static_cast<cublasMath_t>(7)), CUBLAS_STATUS_INVALID_VALUE);
  // Empty products succeed without work.
  EXPECT_EQ(gemm(handle_, kN, 0, 2, 2, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(handle_, kN, 2, 2, 2, 2, 2, 2, 0), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(dc.Read(), std::vector<double>(64, 7));
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)), "");
}

// A handle belongs to the device current at its creation.
TEST_F(CublasTest, HandleOfAnotherDeviceFails) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "one device";
  const Device da({1}, F32), db({1}, F32), dc({0}, F32);
  const float alpha = 1, beta = 0;
  const auto sgemm = [&] {
    return cublasSgemm(handle_, kN, kN, 1, 1, 1, &alpha, static_cast<float*>(da.get()), 1,
                       static_cast<float*>(db.get()), 1, &beta, static_cast<float*>(dc.get()), 1);
  };
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(sgemm(), CUBLAS_STATUS_EXECUTION_FAILED);  // current device 1, handle of device 0
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cublasSetStream(handle_, other), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(), CUBLAS_STATUS_EXECUTION_FAILED);  // a stream of device 1
  cudaStream_t got = nullptr;
  ASSERT_EQ(cublasGetStream(handle_, &got), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, other);
  ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(sgemm(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(dc.Read(), std::vector<double>{1});
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(other), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// ---- cuBLASLt ----

// The descriptors of one cublasLtMatmul, destroyed with it.
struct Lt {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Lt() { Reset(); }
  void Reset() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    op = nullptr;
    a = b = c = d = nullptr;
    pref = nullptr;
  }
};

cublasLtMatrixLayout_t LayoutOf(const Matrix& x, cudaDataType_t type) {
  cublasLtMatrixLayout_t layout = nullptr;
  EXPECT_EQ(
      cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(x.rows), static_cast<uint64_t>(x.cols), x.ld),
      CUBLAS_STATUS_SUCCESS);
  if (x.row_major) {
    const int32_t order = CUBLASLT_ORDER_ROW;
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)),
              CUBLAS_STATUS_SUCCESS);
  }
  if (x.batch > 1) {
    const int32_t count = x.batch;
    const int64_t stride = x.stride;
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        CUBLAS_STATUS_SUCCESS);
  }
  return layout;
}

template <class V>
void SetDesc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& value) {
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)), CUBLAS_STATUS_SUCCESS) << attr;
}

struct LtCase {
  cublasOperation_t ta, tb;
  int m, n, k, batch;
  bool a_rows, b_rows, d_rows;  // row-major layouts
  cudaDataType_t in, out;
  cublasLtEpilogue_t epilogue;
  float beta;
  bool separate_c;  // C a matrix of its own (other leading dimension), else C is D
  int aux_pad;      // extra multiples of 8 in the auxiliary leading dimension
};

void PrintTo(const LtCase& t, std::ostream* os) {
  *os << "op " << t.ta << t.tb << " m " << t.m << " n " << t.n << " k " << t.k << " batch " << t.batch << " row-major "
      << t.a_rows << t.b_rows << t.d_rows << " types " << t.in << "->" << t.out << " epilogue " << t.epilogue
      << " beta " << t.beta << (t.separate_c ? " separate C" : "") << " aux pad " << t.aux_pad;
}

class LtTest : public CublasTest, public ::testing::WithParamInterface<LtCase> {};

// D = epilogue(alpha op(A) op(B) + beta C + bias), the GELU input stored in
// the auxiliary matrix: column-major m x n with its own leading dimension.
TEST_P(LtTest, MatchesReference) {
  const LtCase& t = GetParam();
  const bool ta = t.ta != CUBLAS_OP_N, tb = t.tb != CUBLAS_OP_N;
  const bool bias = (t.epilogue & CUBLASLT_EPILOGUE_BIAS) != 0, aux = (t.epilogue & 128) != 0;
  const bool gelu = (t.epilogue & CUBLASLT_EPILOGUE_GELU) != 0, relu = (t.epilogue & CUBLASLT_EPILOGUE_RELU) != 0;
  Matrix a(ta ? t.k : t.m, ta ? t.m : t.k, 1, t.batch, t.a_rows);
  Matrix b(tb ? t.n : t.k, tb ? t.k : t.n, 2, t.batch, t.b_rows);
  Matrix d(t.m, t.n, 1, t.batch, t.d_rows);
  Matrix c(t.m, t.n, t.separate_c ? 3 : 1, t.batch, t.d_rows);
  a.Fill(rng_);
  b.Fill(rng_);
  if (t.beta != 0) (t.separate_c ? c : d).Fill(rng_);
  // Bias: m per batch, then a gap; aux: ld a multiple of 8, batch stride too.
  const int64_t bias_stride = t.m + 2;
  std::vector<double> bias_values(static_cast<size_t>(bias_stride * t.batch), kNaN);
  for (int batch = 0; batch < t.batch; ++batch) {
    for (int i = 0; i < t.m; ++i) bias_values[static_cast<size_t>(batch * bias_stride + i)] = (i % 7 - 3) / 4.0;
  }
  const int64_t aux_ld = (t.m + 7) / 8 * 8 + 8 * t.aux_pad;
  const int64_t aux_stride = (aux_ld * t.n + 7) / 8 * 8 + 8;
  Matrix aux_layout(t.m, t.n, aux_ld - t.m, 1);
  aux_layout.stride = aux_stride;
  aux_layout.batch = t.batch;
  aux_layout.values.assign(static_cast<size_t>(aux_stride * t.batch), kNaN);

  const Device da(a.values, t.in), db(b.values, t.in), dd(d.values, t.out), dc(c.values, t.out);
  const Device dbias(bias_values, t.out), daux(aux_layout.values, t.out);
  const Device& c_buffer = t.separate_c ? dc : dd;
  const Matrix& c_matrix = t.separate_c ? c : d;

  Lt lt;
  ASSERT_EQ(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  SetDesc(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(t.ta));
  SetDesc(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(t.tb));
  SetDesc(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, t.epilogue);
  if (bias) {
    SetDesc(lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(dbias.get()));
    SetDesc(lt.op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_stride);
  }
  if (aux) {
    SetDesc(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, daux.get());
    SetDesc(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    SetDesc(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_stride);
  }
  lt.a = LayoutOf(a, t.in);
  lt.b = LayoutOf(b, t.in);
  lt.c = LayoutOf(c_matrix, t.out);
  lt.d = LayoutOf(d, t.out);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&lt.pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, lt.op, lt.a, lt.b, lt.c, lt.d, lt.pref, 1, &result, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  EXPECT_EQ(result.state, CUBLAS_STATUS_SUCCESS);
  const float alpha = 1.25f;
  Gate gate(stream_);
  ASSERT_EQ(cublasLtMatmul(lt_, lt.op, &alpha, da.get(), lt.a, db.get(), lt.b, &t.beta, c_buffer.get(), lt.c, dd.get(),
                           lt.d, &result.algo, nullptr, 0, stream_),
            CUBLAS_STATUS_SUCCESS);
  lt.Reset();  // the queued product needs no descriptor
  gate.Open();
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);

  std::vector<double> expected(d.values.size()), scale(d.values.size());
  std::vector<double> expected_aux(aux_layout.values.size()), scale_aux(aux_layout.values.size());
  for (int batch = 0; batch < t.batch; ++batch) {
    for (int i = 0; i < t.m; ++i) {
      for (int j = 0; j < t.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int p = 0; p < t.k; ++p) {
          const double x = Op(a, ta, batch, i, p) * Op(b, tb, batch, p, j);
          sum += x;
          magnitude += std::fabs(x);
        }
        const double c0 = t.beta != 0 ? c_matrix.At(batch, i, j) : 0.0;
        const double b0 = bias ? bias_values[static_cast<size_t>(batch * bias_stride + i)] : 0.0;
        const double v = alpha * sum + t.beta * c0 + b0;
        const double s = alpha * magnitude + std::fabs(t.beta * c0) + std::fabs(b0);
        const auto at = static_cast<size_t>(d.Index(batch, i, j));
        expected[at] = gelu ? Gelu(v) : relu ? std::max(v, 0.0) : v;
        scale[at] = s;
        if (aux) {
          const auto aux_at = static_cast<size_t>(batch * aux_stride + i + j * aux_ld);
          expected_aux[aux_at] = v;
          scale_aux[aux_at] = s;
        }
      }
    }
  }
  ExpectMatrix(d, dd.Read(), expected, scale, t.out, "D");
  if (aux) ExpectMatrix(aux_layout, daux.Read(), expected_aux, scale_aux, t.out, "aux");
  if (t.separate_c) {
    EXPECT_EQ(Encode(dc.Read(), t.out), Encode(c.values, t.out)) << "C was written";
  }
}

constexpr cublasLtEpilogue_t kDefault = CUBLASLT_EPILOGUE_DEFAULT, kBias = CUBLASLT_EPILOGUE_BIAS;
constexpr cublasLtEpilogue_t kGeluAuxBias = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;

INSTANTIATE_TEST_SUITE_P(
    Layouts, LtTest,
    ::testing::Values(
        LtCase{kN, kN, 6, 5, 4, 1, false, false, false, F32, F32, kDefault, 0, false, 0},
        LtCase{kT, kN, 6, 5, 4, 1, false, false, false, F32, F32, kBias, 0, false, 0},
        LtCase{kN, kT, 9, 7, 5, 1, false, false, false, F32, F32, kBias, 0.5f, true, 0},
        LtCase{kT, kT, 16, 6, 11, 1, false, false, false, F32, F32, kGeluAuxBias, 0, false, 0},
        LtCase{kN, kN, 13, 9, 7, 1, false, false, false, F32, F32, kGeluAuxBias, -1, true, 2},
        LtCase{kN, kT, 8, 10, 6, 3, false, false, false, F32, F32, kGeluAuxBias, 0, false, 1},
        LtCase{kT, kN, 7, 5, 9, 2, true, false, true, F32, F32, kBias, 1, false, 0},
        LtCase{kN, kN, 5, 8, 3, 2, true, true, false, BF16, F32, CUBLASLT_EPILOGUE_RELU_BIAS, 0, false, 0},
        LtCase{kT, kN, 24, 16, 12, 1, false, false, false, F16, F32, kGeluAuxBias, 0, false, 0},
        LtCase{kN, kN, 16, 4, 8, 1, false, false, false, BF16, BF16, kGeluAuxBias, 0, false, 0},
        LtCase{kN, kT, 11, 6, 10, 1, false, true, false, F16, F16, CUBLASLT_EPILOGUE_GELU_BIAS, 0.5f, true, 0}));

uint32_t AlignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// ops/cuda/matmul.cu's LaunchGemmBiasLt, call for call: the row-major
// z = x w + bias (M x K times K x N), y = gelu(z), as the column-major
// y^T = w^T x^T with the bias along y^T's rows.
void TesseraBiasGelu(cublasLtHandle_t handle, cudaStream_t stream, cudaDataType_t type, int64_t M, int64_t N, int64_t K,
                     const void* x, const void* w, const float* bias, float* z, float* y) {
  Lt desc;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  SetDesc(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  SetDesc(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  SetDesc(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, z);
  SetDesc(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, N);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&desc.a, type, static_cast<uint64_t>(N), static_cast<uint64_t>(K), N),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&desc.b, type, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&desc.pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t workspace = 0;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                 sizeof(workspace)),
            CUBLAS_STATUS_SUCCESS);
  for (const auto& [attribute, pointer] :
       {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, w},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, x},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<const void*>(y)},
        std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<const void*>(y)}}) {
    const uint32_t alignment = AlignmentOf(pointer);
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(desc.pref, attribute, &alignment, sizeof(alignment)),
              CUBLAS_STATUS_SUCCESS);
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  ASSERT_EQ(
      cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &result, &found),
      CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 1);
  const float alpha = 1, beta = 0;
  ASSERT_EQ(cublasLtMatmul(handle, desc.op, &alpha, w, desc.a, x, desc.b, &beta, y, desc.d, y, desc.d, &result.algo,
                           nullptr, 0, stream),
            CUBLAS_STATUS_SUCCESS);
}

TEST_F(CublasTest, TesseraRowMajorBiasGeluMapping) {
  for (const cudaDataType_t type : {F32, BF16, F16}) {
    constexpr int64_t M = 5, N = 16, K = 7;
    Matrix x(M, K, 0, 1, true), w(K, N, 0, 1, true);  // row-major, as Tessera's tensors
    x.Fill(rng_);
    w.Fill(rng_);
    std::vector<double> bias(N);
    for (int64_t j = 0; j < N; ++j) bias[static_cast<size_t>(j)] = (j % 5 - 2) / 2.0;
    const Device dx(x.values, type), dw(w.values, type), dbias(bias, F32);
    const Device dz(std::vector<double>(M * N, kNaN), F32), dy(std::vector<double>(M * N, kNaN), F32);
    TesseraBiasGelu(lt_, stream_, type, M, N, K, dx.get(), dw.get(), static_cast<const float*>(dbias.get()),
                    static_cast<float*>(dz.get()), static_cast<float*>(dy.get()));
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<double> z = dz.Read(), y = dy.Read();
    for (int64_t r = 0; r < M; ++r) {
      for (int64_t col = 0; col < N; ++col) {
        double sum = bias[static_cast<size_t>(col)];
        for (int64_t p = 0; p < K; ++p) sum += x.At(0, r, p) * w.At(0, p, col);
        const auto at = static_cast<size_t>(r * N + col);
        EXPECT_NEAR(z[at], sum, 1e-5) << r << ", " << col;
        EXPECT_NEAR(y[at], Gelu(sum), 1e-5) << r << ", " << col;
      }
    }
  }
}

// A small valid problem (f32, 8 x 8 x 8, BIAS) whose parts the refusals change.
class LtRefusals : public CublasTest {
 protected:
  void SetUp() override {
    CublasTest::SetUp();
    ASSERT_EQ(cublasLtMatmulDescCreate(&lt_desc_.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
    SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias_.get()));
    for (cublasLtMatrixLayout_t* l : {&lt_desc_.a, &lt_desc_.b, &lt_desc_.c, &lt_desc_.d}) {
      ASSERT_EQ(cublasLtMatrixLayoutCreate(l, CUDA_R_32F, 8, 8, 8), CUBLAS_STATUS_SUCCESS);
    }
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&lt_desc_.pref), CUBLAS_STATUS_SUCCESS);
  }

  cublasStatus_t Heuristic(int* found, cublasLtMatmulHeuristicResult_t* result = nullptr) {
    cublasLtMatmulHeuristicResult_t local = {};
    *found = -1;
    return cublasLtMatmulAlgoGetHeuristic(lt_, lt_desc_.op, lt_desc_.a, lt_desc_.b, lt_desc_.c, lt_desc_.d,
                                          lt_desc_.pref, 1, result != nullptr ? result : &local, found);
  }
  cublasStatus_t Matmul(const cublasLtMatmulAlgo_t* algo, const void* a, const void* b) {
    const float alpha = 1, beta = 0;
    return cublasLtMatmul(lt_, lt_desc_.op, &alpha, a, lt_desc_.a, b, lt_desc_.b, &beta, d_.get(), lt_desc_.c, d_.get(),
                          lt_desc_.d, algo, nullptr, 0, stream_);
  }

  Device a_{std::vector<double>(72, 1), F32}, b_{std::vector<double>(72, 1), F32};
  Device d_{std::vector<double>(64, 0), F32}, bias_{std::vector<double>(8, 0), F32};
  Lt lt_desc_;
};

TEST_F(LtRefusals, AuxiliaryLeadingDimension) {
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, d_.get());
  int found = 0;
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_INVALID_VALUE);  // unset: 0 < m
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{12});
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_NOT_SUPPORTED);  // not divisible by 8
  EXPECT_EQ(found, 0);
  EXPECT_EQ(Matmul(nullptr, a_.get(), b_.get()), CUBLAS_STATUS_NOT_SUPPORTED);
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{16});
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(found, 1);
}

TEST_F(LtRefusals, Alignment) {
  const auto* b = static_cast<const float*>(b_.get());
  const uint32_t sixteen = 16, two = 2;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(lt_desc_.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &two,
                                                 sizeof(two)),
            CUBLAS_STATUS_SUCCESS);
  int found = 0;
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_NOT_SUPPORTED);  // below an f32's size
  EXPECT_EQ(found, 0);
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(lt_desc_.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &sixteen,
                                                 sizeof(sixteen)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t result = {};
  ASSERT_EQ(Heuristic(&found, &result), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Matmul(&result.algo, a_.get(), b + 1), CUBLAS_STATUS_INVALID_VALUE);  // 4-byte aligned, 16 declared
  EXPECT_EQ(Matmul(&result.algo, a_.get(), b + 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Matmul(nullptr, a_.get(), b + 1), CUBLAS_STATUS_SUCCESS);  // implicit heuristic: these pointers
  uint32_t got = 0;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(lt_desc_.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, nullptr, 0,
                                                 &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(uint32_t));
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(lt_desc_.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &got,
                                                 sizeof(got), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(got, 16u);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

TEST_F(LtRefusals, InconsistentLayoutsAndArguments) {
  int found = 0;
  ASSERT_EQ(Heuristic(&found), CUBLAS_STATUS_SUCCESS);
  const uint64_t seven = 7;
  // A's rows must be D's rows (m).
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.a, CUBLASLT_MATRIX_LAYOUT_ROWS, &seven, sizeof(seven)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Matmul(nullptr, a_.get(), b_.get()), CUBLAS_STATUS_INVALID_VALUE);
  // With op(A) = A^T (8 x 7 stored, k 7), B's rows (k) must follow.
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(CUBLAS_OP_T));
  const uint64_t eight = 8;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.a, CUBLASLT_MATRIX_LAYOUT_COLS, &eight, sizeof(eight)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_INVALID_VALUE);  // k 7, B has 8 rows
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_ROWS, &seven, sizeof(seven)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_SUCCESS);
  // A leading dimension below the rows.
  const int64_t small_ld = 6;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_LD, &small_ld, sizeof(small_ld)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_INVALID_VALUE);
  const int64_t ld = 8;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)),
            CUBLAS_STATUS_SUCCESS);
  // Batch counts must agree.
  const int32_t two = 2;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, sizeof(two)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_INVALID_VALUE);
  // An attribute of the wrong size, and the algorithm count.
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &ld, sizeof(ld)),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulHeuristicResult_t result = {};
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt_, lt_desc_.op, lt_desc_.a, lt_desc_.b, lt_desc_.c, lt_desc_.d,
                                           lt_desc_.pref, 0, &result, &found),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, lt_desc_.op, lt_desc_.a, lt_desc_.b, lt_desc_.c, lt_desc_.d,
                                           lt_desc_.pref, 1, &result, &found),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_F(LtRefusals, EmptyExtentHasNoAlgorithm) {
  const uint64_t zero = 0;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.a, CUBLASLT_MATRIX_LAYOUT_COLS, &zero, sizeof(zero)),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_ROWS, &zero, sizeof(zero)),
            CUBLAS_STATUS_SUCCESS);
  const int64_t one = 1;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(lt_desc_.b, CUBLASLT_MATRIX_LAYOUT_LD, &one, sizeof(one)),
            CUBLAS_STATUS_SUCCESS);
  int found = 0;
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(found, 0);
  EXPECT_EQ(Matmul(nullptr, a_.get(), b_.get()), CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(LtRefusals, EpilogueArguments) {
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  ASSERT_EQ(Heuristic(&found, &result), CUBLAS_STATUS_SUCCESS);
  // An algorithm chosen for BIAS does not run GELU.
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_BIAS);
  EXPECT_EQ(Matmul(&result.algo, a_.get(), b_.get()), CUBLAS_STATUS_INVALID_VALUE);
  // BIAS without a bias vector.
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr));
  EXPECT_EQ(Matmul(&result.algo, a_.get(), b_.get()), CUBLAS_STATUS_INVALID_VALUE);
  // Epilogues the emulator lacks, and an unknown attribute.
  SetDesc(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_AUX);
  EXPECT_EQ(Heuristic(&found), CUBLAS_STATUS_NOT_SUPPORTED);
  const int32_t value = 0;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(lt_desc_.op, static_cast<cublasLtMatmulDescAttributes_t>(9), &value,
                                           sizeof(value)),
            CUBLAS_STATUS_INVALID_VALUE);
  uint32_t epilogue = 0;
  EXPECT_EQ(
      cublasLtMatmulDescGetAttribute(lt_desc_.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), nullptr),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(epilogue, static_cast<uint32_t>(CUBLASLT_EPILOGUE_RELU_AUX));
}

}  // namespace
