// C wrappers for the prototypes cgo cannot export itself: those with const pointer arguments and
// nvmlErrorString's const return. Compiled with NVML's header, so the compiler checks each one
// against the header's prototype.
#include <stddef.h>
#include "nvml.h"
#include "_cgo_export.h"

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return nvmld_DeviceGetHandleByUUID((char *)uuid, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return nvmld_DeviceGetHandleByPciBusId_v2((char *)pciBusId, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device) {
    return nvmld_DeviceGetHandleByPciBusId_v2((char *)pciBusId, device);
}

nvmlReturn_t DECLDIR nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t device, unsigned int profileId,
        const nvmlGpuInstancePlacement_t *placement, nvmlGpuInstance_t *gpuInstance) {
    return nvmld_DeviceCreateGpuInstanceWithPlacement(device, profileId, (nvmlGpuInstancePlacement_t *)placement,
                                                      gpuInstance);
}

nvmlReturn_t DECLDIR nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t gpuInstance,
        unsigned int profileId, const nvmlComputeInstancePlacement_t *placement,
        nvmlComputeInstance_t *computeInstance) {
    return nvmld_GpuInstanceCreateComputeInstanceWithPlacement(gpuInstance, profileId,
            (nvmlComputeInstancePlacement_t *)placement, computeInstance);
}

// The strings the real library returns for each code.
const DECLDIR char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "Not supported as ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

// nvmlInternalGetExportTable is NVML's private table of undocumented entry points; NVIDIA's own
// nvidia-smi asks for it right after nvmlInit and refuses to run ("Mismatch in versions between
// nvidia-smi and NVML") when the call fails. The double has no such table: it reports success and
// leaves the caller's table pointer as it was (NULL), which nvidia-smi accepts for the public-API
// commands.
nvmlReturn_t DECLDIR nvmlInternalGetExportTable(const void **ppExportTable, const void *pExportTableId) {
    (void)ppExportTable;
    (void)pExportTableId;
    return NVML_SUCCESS;
}
