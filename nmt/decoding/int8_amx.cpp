// nmt::int8_rows' sums through AMX (Intel's tile registers: Sapphire Rapids and later), where
// the CPU has AMX-INT8 and Linux lets this process use it.
//
// One tdpbusd multiplies a tile of up to 16 rows x 64 u8 activations by 64 inputs x 16 outputs
// of int8 weights and adds the exact int32 sums into a tile of 16 outputs a row: the VNNI
// kernel's sums (vpdpbusd, nmt::int8_rows), so that the outputs are the same bit for bit, at a
// fraction of its instructions where a step has more than a row or two. The weights need no
// packing of their own: a group of int8_rows_pack's VNNI layout (Kp / 4, 64, 4) holds, 256
// bytes a quad of inputs, the four 16-output tiles side by side (64 bytes apart), so a tile's
// 16 rows of inputs load with a stride of 256 bytes.
//
// Built into the AVX-512 object only, by a compiler that has AMX's intrinsics (GCC 11, Clang 12
// and later; an older one builds amx_usable() as false), its functions compiled for AMX alone
// (target attributes), and taken only where amx_usable() says so (nmt::int8_rows_amx reports
// it).

#if defined(CPU_CAPABILITY_AVX512) && defined(__has_include)
#if __has_include(<amxtileintrin.h>) || __has_include(<amxintrin.h>)
#define NMT_AMX 1
#endif
#endif

#if defined(NMT_AMX)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "int8_amx.h"

#include <atomic>
#include <cstdint>

namespace nmt_amx {

#if defined(NMT_AMX)
namespace {

constexpr long kReqPerm = 0x1023;  // arch_prctl's ARCH_REQ_XCOMP_PERM
constexpr long kTileData = 18;  // XFEATURE_XTILEDATA: the tiles' state

// ldtilecfg's 64 bytes: palette 1, each tile's rows and bytes a row.
struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 the activations (rows x 64 u8), 1-3 the weights (16 quads x 16 outputs x 4),
// 4-7 the sums of a group's 64 outputs (rows x 16 int32 each).
Config config(int rows) {
  Config c;
  c.rows[0] = rows;
  c.colsb[0] = kChunk;
  for (int t = 1; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 8; ++t) c.rows[t] = rows, c.colsb[t] = 64;
  return c;
}

// Whether this process has asked Linux for the tiles: -1 not yet (a forked child asks again).
std::atomic<int> asked{-1};

void forget() { asked.store(-1); }

}  // namespace

bool amx_usable() {
  int yes = asked.load(std::memory_order_relaxed);
  if (yes < 0) {
    static const int registered = pthread_atfork(nullptr, nullptr, forget);
    (void)registered;
    unsigned a = 0, b = 0, c = 0, d = 0;  // CPUID leaf 7: EDX bit 24 AMX-TILE, 25 AMX-INT8
    const bool cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3;
    yes = cpu && syscall(SYS_arch_prctl, kReqPerm, kTileData) == 0;
    asked.store(yes);
  }
  return yes;
}

// The sums of one tile of u8 rows (x: Kp apart) times a group of the VNNI layout (wg) into
// out (int32, `bytes` a row): the four 16-output tiles of the group, one tile of inputs.
__attribute__((target("amx-tile,amx-int8"))) inline void one_block(
    const uint8_t* x, int64_t Kp, const int8_t* wg, int32_t* out, int64_t bytes) {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t k = 0; k < Kp; k += kChunk) {
    const int8_t* wk = wg + (k / 4) * 256;  // the chunk's 16 quads, 256 bytes each
    _tile_loadd(0, x + k, Kp);
    _tile_loadd(1, wk, 256);
    _tile_dpbusd(4, 0, 1);
    _tile_loadd(2, wk + 64, 256);
    _tile_dpbusd(5, 0, 2);
    _tile_loadd(3, wk + 128, 256);
    _tile_dpbusd(6, 0, 3);
    _tile_loadd(1, wk + 192, 256);
    _tile_dpbusd(7, 0, 1);
  }
  _tile_stored(4, out, bytes);
  _tile_stored(5, out + 16, bytes);
  _tile_stored(6, out + 32, bytes);
  _tile_stored(7, out + 48, bytes);
}

// Each group's weights are read for every block of rows before the next group's.
__attribute__((target("amx-tile,amx-int8"))) void amx_sums(const uint8_t* x, int64_t rows,
                                                            int64_t blocks, int64_t Kp,
                                                            const int8_t* w, int64_t groups,
                                                            int32_t* sums, int64_t stride) {
  const Config c = config(int(rows));
  asm volatile("" : : "r"(&c) : "memory");  // the whole config written before ldtilecfg reads it
  _tile_loadconfig(&c);
  const int64_t bytes = stride * int64_t(sizeof(int32_t));
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* wg = w + g * (Kp / 4) * 256;
    for (int64_t b = 0; b < blocks; ++b)
      one_block(x + b * rows * Kp, Kp, wg, sums + b * rows * stride + g * 64, bytes);
  }
  _tile_release();
}
#else
bool amx_usable() { return false; }

void amx_sums(const uint8_t*, int64_t, int64_t, int64_t, const int8_t*, int64_t, int32_t*,
              int64_t) {}
#endif

}  // namespace nmt_amx
