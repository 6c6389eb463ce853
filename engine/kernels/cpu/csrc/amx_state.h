// AMX tiles in the kernels (linear_amx.h, tile_amx.h): KVLOOP_AMX where the build targets them (-march=native on a
// CPU with AMX-BF16, and AVX512-BF16 for the vector work around them), and whether this process may use them.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include "simd512.h"

#if defined(KVLOOP_AVX512BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define KVLOOP_AMX 1
#endif

#include <cstdint>

namespace kvloop {

#ifdef KVLOOP_AMX
// ldtilecfg's operand: palette 1, each tile's rows and bytes per row (the rest zero).
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
#endif

// Linux grants the tile data state per process, on request (arch_prctl ARCH_REQ_XCOMP_PERM): a tile instruction
// without it faults. Asks for it (a no-op once granted); false where it is refused, or not Linux on x86-64.
// No CPUID check: callers pass on = amx.available() (core/cpu.py: the CPU has tiles); Linux refuses others.
inline bool amx_granted() {
#if defined(KVLOOP_AMX) && defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kGetPermission = 0x1022, kRequestPermission = 0x1023;
  constexpr int kTileData = 18;  // XFEATURE_XTILEDATA
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kGetPermission, &granted) == 0 && (granted & (1UL << kTileData))) return true;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
#else
  return false;
#endif
}

}  // namespace kvloop
