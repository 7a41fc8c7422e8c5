package main

// go-nvml's nvml.h declares each handle as a struct holding one pointer (NVIDIA's own header has
// "typedef struct nvmlDevice_st* nvmlDevice_t"); on x86-64 and arm64 both travel in one register,
// so the ABI is the same. These convert between the handle types and the issued pointers.

/*
#include "nvml.h"
*/
import "C"

import "unsafe"

func devH(p unsafe.Pointer) C.nvmlDevice_t {
	return C.nvmlDevice_t{handle: (*C.struct_nvmlDevice_st)(p)}
}

func giH(p unsafe.Pointer) C.nvmlGpuInstance_t {
	return C.nvmlGpuInstance_t{handle: (*C.struct_nvmlGpuInstance_st)(p)}
}

func ciH(p unsafe.Pointer) C.nvmlComputeInstance_t {
	return C.nvmlComputeInstance_t{handle: (*C.struct_nvmlComputeInstance_st)(p)}
}

func setH(p unsafe.Pointer) C.nvmlEventSet_t {
	return C.nvmlEventSet_t{handle: (*C.struct_nvmlEventSet_st)(p)}
}
