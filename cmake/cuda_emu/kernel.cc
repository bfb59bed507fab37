// The CUDA emulator's kernel launches (cuda_runtime.h). A grid runs on its
// stream's thread, block after block. A block's CUDA threads run on fibers
// of that thread: a fiber runs one CUDA thread after another (in a
// pseudo-random order) until one waits at a barrier (__syncthreads, a
// warp's shuffle); that thread keeps the fiber, and a new fiber takes the
// next threads. A barrier opens once every thread still running (of the
// block, or of the warp) waits at it; threads that exited no longer count,
// as on a GPU. Threads that wait at different barriers with none left to
// run (a __syncthreads some threads skip) fail the launch instead of
// hanging. A kernel without barriers thus costs one fiber per block.
// Within a pass, a fiber whose thread waits switches straight to the next
// fiber to run (one whose barrier opened, else a new one for the threads
// not started), not through the scheduler: one switch per wait, not two.
//
// Fibers switch by a few instructions of our own (x86-64 System V: the
// callee-saved registers and the stack pointer), not ucontext, whose every
// switch is a system call. The floating-point control registers are not
// switched: every fiber of a host thread runs with that thread's (kernels
// never change them).

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <vector>

#include "cuda_emu/float16.h"
#include "cuda_emu/internal.h"
#include "cuda_runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#define TESSERA_EMU_ASAN 1
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator's fibers switch stacks on x86-64 only"
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// Saves the callee-saved state on the current stack, stores the stack
// pointer in *save, and continues on `next` (a stack this function saved,
// or one NewFiberStack prepared).
extern "C" void cuda_emu_switch(void** save, void* next);
asm(R"(
  .text
  .globl cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
)");

namespace cuda_emu {

int SharedMemoryLimit(const void* kernel);  // runtime.cc

namespace {

#ifdef TESSERA_EMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif
constexpr size_t kGuardBytes = 4096;

struct TrapSignal {};

enum class State { kPending, kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

// A fiber's stack: mapped once, reused, with a guard page below it (an
// overflow faults instead of corrupting).
struct Stack {
  Stack() {
    base = static_cast<char*>(mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base == MAP_FAILED) throw std::bad_alloc();
    mprotect(base, kGuardBytes, PROT_NONE);
  }
  ~Stack() { munmap(base, kStackBytes + kGuardBytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return base + kGuardBytes; }
  char* top() const { return base + kGuardBytes + kStackBytes; }
  char* base = nullptr;
};

struct Fiber {
  Stack* stack = nullptr;
  void* sp = nullptr;  // saved while switched out
  int thread = -1;     // the CUDA thread it runs
  bool done = false;
};

// The block running on this host thread.
struct Block {
  std::vector<State> states;    // per CUDA thread
  std::vector<uint3> coords;    // per CUDA thread: its threadIdx
  std::vector<uint64_t> slots;  // the warps' shuffle values
  std::vector<std::array<uint32_t, 6>> mma;  // the warps' mma fragments (a, b)
  std::vector<int> order;       // the CUDA threads in the order they start
  size_t next = 0;              // order[next] starts next
  void* shared = nullptr;
  const std::function<void()>* body = nullptr;
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  bool trapped = false;
  // The pass: fibers to resume (their barrier opened), in order.
  std::vector<Fiber*> queue;
  size_t queued = 0;  // queue[queued] runs next
  // This block's fibers and the stacks they took.
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<std::unique_ptr<Stack>> used;
#ifdef TESSERA_EMU_ASAN
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

thread_local Block* current_block = nullptr;
thread_local std::vector<std::unique_ptr<Stack>> free_stacks;

void* NewFiberStack(Stack& stack);

// A fiber for the threads not started yet, on a free stack.
Fiber* NewFiber(Block& b) {
  if (free_stacks.empty()) free_stacks.push_back(std::make_unique<Stack>());
  b.used.push_back(std::move(free_stacks.back()));
  free_stacks.pop_back();
  auto f = std::make_unique<Fiber>();
  f->stack = b.used.back().get();
  f->sp = NewFiberStack(*f->stack);
  b.fibers.push_back(std::move(f));
  return b.fibers.back().get();
}

void SetThread(Block& b, int t) {
  b.current->thread = t;
  threadIdx = b.coords[static_cast<size_t>(t)];
}

// From fiber f to what runs next in the pass: the next queued fiber, else a
// new fiber while threads are not started (never for a `finished` fiber:
// it ends only once every thread started), else the scheduler. Returns when
// f is resumed (never once `finished`).
void Onward(Block& b, Fiber* f, bool finished) {
  Fiber* next = nullptr;
  if (b.queued < b.queue.size()) {
    next = b.queue[b.queued++];
  } else if (b.next < b.order.size()) {
    next = NewFiber(b);
  }
  void* to = b.scheduler_sp;
  if (next != nullptr) {
    b.current = next;
    to = next->sp;
  }
#ifdef TESSERA_EMU_ASAN
  void* fake = nullptr;
  if (next != nullptr) {
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, next->stack->bottom(), kStackBytes);
  } else {
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake, b.scheduler_stack, b.scheduler_stack_size);
  }
  cuda_emu_switch(&f->sp, to);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)finished;
  cuda_emu_switch(&f->sp, to);
#endif
}

// A fiber's life: CUDA threads from the block's order until none is left.
[[noreturn]] void FiberMain() {
  Block& b = *current_block;
#ifdef TESSERA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  Fiber* f = b.current;
  while (b.next < b.order.size()) {
    const int t = b.order[b.next++];
    SetThread(b, t);
    b.states[static_cast<size_t>(t)] = State::kReady;
    try {
      (*b.body)();
    } catch (const TrapSignal&) {
      b.trapped = true;
    }
    b.states[static_cast<size_t>(t)] = State::kDone;
  }
  f->done = true;
  Onward(b, f, /*finished=*/true);
  __builtin_unreachable();
}

// A stack whose first switch enters FiberMain.
void* NewFiberStack(Stack& stack) {
  auto* top = reinterpret_cast<uint64_t*>(stack.top());  // 16-byte aligned
  uint64_t* sp = top;
  *--sp = 0;                                       // FiberMain's return address: none
  *--sp = reinterpret_cast<uint64_t>(&FiberMain);  // where the switch's ret goes
  for (int i = 0; i < 6; ++i) *--sp = 0;           // rbp rbx r12 r13 r14 r15
  return sp;
}

void Resume(Block& b, Fiber& f) {
  b.current = &f;
#ifdef TESSERA_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack->bottom(), kStackBytes);
  cuda_emu_switch(&b.scheduler_sp, f.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  cuda_emu_switch(&b.scheduler_sp, f.sp);
#endif
}

void Wait(State at) {
  Block& b = *current_block;
  Fiber* f = b.current;
  const int t = f->thread;
  b.states[static_cast<size_t>(t)] = at;
  Onward(b, f, /*finished=*/false);
  b.current = f;
  SetThread(b, t);  // other threads ran meanwhile
}

// Runs one block; false when its threads wait at barriers that can never
// open.
bool RunBlock(Block& b, std::minstd_rand& rng) {
  const size_t n = b.states.size();
  std::fill(b.states.begin(), b.states.end(), State::kPending);
  std::shuffle(b.order.begin(), b.order.end(), rng);
  b.next = 0;
  b.fibers.clear();
  b.used.clear();
  const size_t warps = (n + 31) / 32;
  bool ok = true;
  while (true) {
    // A pass: the waiting threads whose barrier opened, then the threads
    // not started yet, each fiber switching on to the next (Onward).
    b.queue.clear();
    b.queued = 0;
    for (auto& f : b.fibers) {
      if (!f->done && b.states[static_cast<size_t>(f->thread)] == State::kReady) b.queue.push_back(f.get());
    }
    std::shuffle(b.queue.begin(), b.queue.end(), rng);
    if (!b.queue.empty()) {
      Resume(b, *b.queue[b.queued++]);
    } else if (b.next < n) {
      Resume(b, *NewFiber(b));
    }
    bool opened = false;
    for (size_t w = 0; w < warps; ++w) {
      bool all = true, any = false;
      for (size_t i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
        if (b.states[i] == State::kDone) continue;
        all = all && b.states[i] == State::kAtWarpBarrier;
        any = true;
      }
      if (any && all) {
        for (size_t i = w * 32; i < std::min(n, w * 32 + 32); ++i) {
          if (b.states[i] == State::kAtWarpBarrier) b.states[i] = State::kReady;
        }
        opened = true;
      }
    }
    bool all = true, any = false;
    for (State s : b.states) {
      if (s == State::kDone) continue;
      all = all && s == State::kAtBlockBarrier;
      any = true;
    }
    if (!any) break;
    if (all) {
      for (State& s : b.states) {
        if (s == State::kAtBlockBarrier) s = State::kReady;
      }
      opened = true;
    }
    if (!opened) {
      ok = false;  // the waiting fibers are abandoned: their stacks are unmapped below
      break;
    }
  }
  for (auto& s : b.used) {
    if (ok) {
      free_stacks.push_back(std::move(s));
    }
  }
  b.used.clear();
  b.fibers.clear();
  return ok;
}

// Kernels run one block at a time each: `__shared__` variables are
// function statics. Different kernels run at once on different streams.
std::mutex& KernelMutex(const void* kernel) {
  static std::mutex* mu = new std::mutex;
  static auto* per_kernel = new std::map<const void*, std::unique_ptr<std::mutex>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto& m = (*per_kernel)[kernel];
  if (m == nullptr) m = std::make_unique<std::mutex>();
  return *m;
}

cudaError_t RunGrid(const LaunchShape& shape, const std::function<void()>& body) {
  const dim3 bd = shape.block;
  const int threads = static_cast<int>(bd.x * bd.y * bd.z);
  std::vector<unsigned char> shared(shape.shared_bytes);
  std::lock_guard<std::mutex> lock(KernelMutex(shape.kernel));
  std::minstd_rand rng(0x5eed);
  Block block;
  block.body = &body;
  block.states.resize(static_cast<size_t>(threads));
  block.slots.resize(static_cast<size_t>(threads));
  block.mma.resize(static_cast<size_t>(threads));
  block.order.resize(static_cast<size_t>(threads));
  block.coords.resize(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    block.order[static_cast<size_t>(t)] = t;
    block.coords[static_cast<size_t>(t)] = uint3{t % bd.x, (t / bd.x) % bd.y, t / (bd.x * bd.y)};
  }
  blockDim = shape.block;
  gridDim = shape.grid;
  current_block = &block;
#ifdef TESSERA_EMU_ASAN
  // The scheduler's stack (this thread's), for the switches back to it.
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* base = nullptr;
    size_t size = 0;
    pthread_attr_getstack(&attr, &base, &size);
    block.scheduler_stack = base;
    block.scheduler_stack_size = size;
    pthread_attr_destroy(&attr);
  }
#endif
  cudaError_t result = cudaSuccess;
  for (unsigned int bz = 0; bz < shape.grid.z && result == cudaSuccess; ++bz) {
    for (unsigned int by = 0; by < shape.grid.y && result == cudaSuccess; ++by) {
      for (unsigned int bx = 0; bx < shape.grid.x && result == cudaSuccess; ++bx) {
        blockIdx = uint3{bx, by, bz};
        // Shared memory holds whatever was there: NaN as floats.
        if (!shared.empty()) std::memset(shared.data(), 0xff, shared.size());
        block.shared = shared.empty() ? nullptr : shared.data();
        if (!RunBlock(block, rng)) {
          std::fprintf(stderr, "cuda_emu: block (%u, %u, %u): threads wait at different barriers\n", bx, by, bz);
          result = cudaErrorLaunchFailure;
        } else if (block.trapped) {
          result = cudaErrorAssert;
        }
      }
    }
  }
  current_block = nullptr;
  return result;
}

}  // namespace

void LaunchGrid(const LaunchShape& shape, std::function<void()> body) {
  const dim3 b = shape.block, g = shape.grid;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64 || g.x == 0 || g.x > 0x7fffffffu ||
      g.y == 0 || g.y > 65535 || g.z == 0 || g.z > 65535) {
    SetLastError(cudaErrorInvalidConfiguration);
    return;
  }
  if (shape.shared_bytes > static_cast<size_t>(SharedMemoryLimit(shape.kernel))) {
    SetLastError(cudaErrorInvalidValue);
    return;
  }
  LoadFunction(StreamDevice(shape.stream), FunctionName(shape.kernel));
  const cudaError_t err =
      Enqueue(shape.stream, [shape, body = std::move(body)]() -> cudaError_t { return RunGrid(shape, body); });
  if (err != cudaSuccess) SetLastError(err);
}

void SyncThreads() { Wait(State::kAtBlockBarrier); }

void SyncWarp() { Wait(State::kAtWarpBarrier); }

int Lane() { return current_block->current->thread % 32; }

uint64_t WarpExchange(uint64_t bits, int src) {
  Block& b = *current_block;
  const int t = b.current->thread;
  b.slots[static_cast<size_t>(t)] = bits;
  Wait(State::kAtWarpBarrier);
  const size_t from = static_cast<size_t>(t - t % 32 + src);
  const uint64_t out = from < b.slots.size() ? b.slots[from] : bits;
  Wait(State::kAtWarpBarrier);
  return out;
}

void WarpMma16816(float* c, const uint32_t* a, const uint32_t* b, bool bf16) {
  Block& blk = *current_block;
  const int t = blk.current->thread, base = t - t % 32, lane = t % 32;
  if (base + 32 > static_cast<int>(blk.mma.size())) Trap();  // needs a whole warp
  blk.mma[static_cast<size_t>(t)] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  Wait(State::kAtWarpBarrier);
  // Element (row, k) of a and (k, n) of b, from the lane PTX places it in.
  auto half = [bf16](uint32_t word, int high) {
    const auto bits = static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu);
    return bf16 ? Bf16ToFloat(bits) : HalfToFloat(bits);
  };
  auto a_at = [&](int row, int k) {
    const auto& f = blk.mma[static_cast<size_t>(base + (row % 8) * 4 + (k % 8) / 2)];
    return half(f[static_cast<size_t>((row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0))], k % 2);
  };
  auto b_at = [&](int k, int n) {
    const auto& f = blk.mma[static_cast<size_t>(base + n * 4 + (k % 8) / 2)];
    return half(f[static_cast<size_t>(4 + (k >= 8 ? 1 : 0))], k % 2);
  };
  const int g = lane / 4, tig = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), n = tig * 2 + i % 2;
    float sum = 0;
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, n);
    c[i] += sum;
  }
  Wait(State::kAtWarpBarrier);  // every lane read the fragments before any writes its next
}

void* DynamicShared() { return current_block->shared; }

void Trap() { throw TrapSignal{}; }

}  // namespace cuda_emu
