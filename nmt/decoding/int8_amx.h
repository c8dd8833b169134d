// nmt::int8_rows' sums through AMX's tiles (int8_amx.cpp), as int8_rows.cpp calls them.
#pragma once

#include <cstdint>

namespace nmt_amx {

constexpr int64_t kTileRows = 16;  // the most rows of a tile
constexpr int64_t kChunk = 64;  // the inputs a tile's row holds (64 bytes): Kp a multiple of it

// Whether this CPU has AMX-INT8 and the kernel may use its tiles (asked of Linux once a
// process).
bool amx_usable();

// The sums of `blocks` x `rows` u8 rows (rows: 1 to 16 a tile; x: Kp apart) times `groups`
// consecutive groups of int8_rows_pack's VNNI layout (w: Kp / 4 x 256 bytes each), Kp a
// multiple of kChunk: sums (blocks x rows, groups x 64) int32, `stride` int32 apart a row.
void amx_sums(const uint8_t* x, int64_t rows, int64_t blocks, int64_t Kp, const int8_t* w,
              int64_t groups, int32_t* sums, int64_t stride);

}  // namespace nmt_amx
