/* Internal interface between the block scheduler (emu_sched.cpp) and the shared-memory
   checker (emu_racecheck.cpp); not seen by kernel sources. See emu_racecheck.cpp. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string>
#include "emu_rt.h"

namespace sharpinf_emu {

// What the scheduler tells the checker.
void rc_block_begin(const LaunchCfg& cfg, unsigned char* dyn);     // each block (its dynamic smem poisoned)
void rc_block_end();                                               // the block finished or failed
void rc_barrier();                                                 // a __syncthreads released: a new interval
void rc_syncwarp(int warp, unsigned lanes);                        // __syncwarp completed for these lanes

// What the checker needs from the scheduler.
[[noreturn]] void fail_running_block(const std::string& msg);  // ends the block like __trap()
std::string thread_label(int lin);                              // "37 (warp 1, lane 5)"
int running_thread();                                           // linear id of the running CUDA thread

}  // namespace sharpinf_emu
