package main

// NVML's C ABI. Every function here has the prototype of pkg/nvml/nvml.h (go-nvml v0.13.4-1):
// cgo writes _cgo_export.h from these signatures and compiles it together with nvml.h, so a
// signature that differs from the header's fails the build. Functions whose header prototype takes
// a const pointer are exported under an nvmld_ name and wrapped in shim.c, because cgo cannot
// spell const.
//
// Arguments are used exactly as a C library would use them: an out pointer is checked for NULL
// (INVALID_ARGUMENT, as every function's doc says) and otherwise written through, an in pointer is
// dereferenced. A wrong call (a structure where a pointer belongs) is not repaired: it faults.

/*
#include <stdlib.h>
#include "nvml.h"
*/
import "C"

import (
	"os"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {}

func locked() func() {
	mu.Lock()
	return mu.Unlock
}

func putString(dst *C.char, length C.uint, s string) rc {
	if dst == nil {
		return rcInvalid
	}
	if uint(len(s))+1 > uint(length) {
		return rcSize
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), len(s)+1)
	copy(b, s)
	b[len(s)] = 0
	return rcOK
}

func putCString(dst []C.char, s string) {
	n := len(s)
	if n > len(dst)-1 {
		n = len(dst) - 1
	}
	for i := 0; i < n; i++ {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}

// --- init ------------------------------------------------------------------------------------------

//export nvmlInit_v2
func nvmlInit_v2() C.nvmlReturn_t { defer locked()(); return doInit() }

//export nvmlInit
func nvmlInit() C.nvmlReturn_t { defer locked()(); return doInit() }

//export nvmlInitWithFlags
func nvmlInitWithFlags(flags C.uint) C.nvmlReturn_t { defer locked()(); return doInit() }

//export nvmlShutdown
func nvmlShutdown() C.nvmlReturn_t {
	defer locked()()
	if initCount == 0 {
		return rcUninit
	}
	initCount--
	return rcOK
}

// --- system ----------------------------------------------------------------------------------------

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	defer locked()()
	if r := enter(); r != rcOK {
		return r
	}
	return putString(version, length, cur.cfg.DriverVersion)
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	defer locked()()
	if r := enter(); r != rcOK {
		return r
	}
	return putString(version, length, cur.cfg.NvmlVersion)
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(v *C.int) C.nvmlReturn_t {
	defer locked()()
	if r := enterArgs(v == nil); r != rcOK {
		return r
	}
	*v = C.int(cur.cfg.CudaDriverVersion)
	return rcOK
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(v *C.int) C.nvmlReturn_t {
	return nvmlSystemGetCudaDriverVersion(v)
}

// --- enumeration -----------------------------------------------------------------------------------

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(count *C.uint) C.nvmlReturn_t {
	defer locked()()
	if r := enterArgs(count == nil); r != rcOK {
		return r
	}
	*count = C.uint(len(cur.visible))
	return rcOK
}

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(count *C.uint) C.nvmlReturn_t { return nvmlDeviceGetCount_v2(count) }

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	defer locked()()
	if r := enter(); r != rcOK {
		return r
	}
	if device == nil || int(index) >= len(cur.visible) {
		return rcInvalid
	}
	g := cur.visible[index]
	if g.o.Lost {
		return rcLost
	}
	*device = devH(issue(hDevice, g.cfgIndex, 0, 0))
	return rcOK
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(index C.uint, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return nvmlDeviceGetHandleByIndex_v2(index, device)
}

//export nvmld_DeviceGetHandleByUUID
func nvmld_DeviceGetHandleByUUID(uuid *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	defer locked()()
	if r := enterArgs(uuid == nil || device == nil); r != rcOK {
		return r
	}
	want := C.GoString(uuid)
	for _, g := range cur.visible {
		if g.uuid == want {
			if g.o.Lost {
				return rcLost
			}
			*device = devH(issue(hDevice, g.cfgIndex, 0, 0))
			return rcOK
		}
		if !strings.HasPrefix(want, "MIG-") || g.o.Lost {
			continue
		}
		// MIG UUIDs name MIG devices (nvmlDeviceGetHandleByUUID accepts them since R470).
		s, err := readState(cur.cfg.StateFile)
		if err != nil || s.GPUs[g.uuid] == nil || s.GPUs[g.uuid].MigMode != 1 {
			continue
		}
		for _, gi := range s.GPUs[g.uuid].GpuInstances {
			for _, ci := range gi.ComputeInstances {
				if migUUID(g, gi.ID, ci.ID) == want {
					*device = devH(issue(hMig, g.cfgIndex, gi.ID, ci.ID))
					return rcOK
				}
			}
		}
	}
	// "NVML_ERROR_NOT_FOUND if uuid does not match a valid device on the system".
	return rcNotFound
}

func normBusID(s string) string {
	var domain, bus, dev, fn uint32
	if _, err := fmtSscanf(s, &domain, &bus, &dev, &fn); err != nil {
		return strings.ToUpper(s)
	}
	return strings.ToUpper(formatBusID(domain, bus, dev))
}

//export nvmld_DeviceGetHandleByPciBusId_v2
func nvmld_DeviceGetHandleByPciBusId_v2(busID *C.char, device *C.nvmlDevice_t) C.nvmlReturn_t {
	defer locked()()
	if r := enterArgs(busID == nil || device == nil); r != rcOK {
		return r
	}
	want := normBusID(C.GoString(busID))
	for _, g := range cur.visible {
		if g.busID == want {
			if g.o.Lost {
				return rcLost
			}
			*device = devH(issue(hDevice, g.cfgIndex, 0, 0))
			return rcOK
		}
	}
	return rcNotFound
}

// --- device identity ---------------------------------------------------------------------------------

func migUUID(g *gpu, gi, ci uint32) string {
	return "MIG-" + nameUUID(g.uuid+"/mig/"+itoa(gi)+"/"+itoa(ci))
}

func migName(r *ref) string {
	p := r.g.model.MIGProfiles.GpuInstanceProfiles[int(r.gi.ProfileID)]
	name := profileName(int(r.gi.ProfileID), p)
	if cp, ok := r.g.model.MIGProfiles.ComputeInstanceProfiles[int(r.gi.ProfileID)][int(r.ci.ProfileID)]; ok && cp.SliceCount != p.SliceCount {
		name = itoa(cp.SliceCount) + "c." + name
	}
	return r.g.model.Name + " MIG " + name
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(device C.nvmlDevice_t, uuid *C.char, length C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	if r.mig {
		return putString(uuid, length, migUUID(r.g, r.gi.ID, r.ci.ID))
	}
	return putString(uuid, length, r.g.uuid)
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(device C.nvmlDevice_t, name *C.char, length C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	if r.mig {
		return putString(name, length, migName(r))
	}
	n, _ := r.g.mock.GetName()
	return putString(name, length, n)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(device C.nvmlDevice_t, brand *C.nvmlBrandType_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), brand == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	b, _ := r.g.mock.GetBrand()
	if r.g.o.Brand != nil {
		b = nvml.BrandType(*r.g.o.Brand)
	}
	*brand = C.nvmlBrandType_t(b)
	return rcOK
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(device C.nvmlDevice_t, arch *C.nvmlDeviceArchitecture_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), arch == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	a, _ := r.g.mock.GetArchitecture()
	*arch = C.nvmlDeviceArchitecture_t(a)
	return rcOK
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(device C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	return get(unsafe.Pointer(device.handle), index, func(r *ref) C.uint { return C.uint(r.g.index) }, hDevice)
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(device C.nvmlDevice_t, minor *C.uint) C.nvmlReturn_t {
	return get(unsafe.Pointer(device.handle), minor, func(r *ref) C.uint { return C.uint(r.g.minor) }, hDevice)
}

func fillPci(r *ref, pci *C.nvmlPciInfo_t) {
	*pci = C.nvmlPciInfo_t{}
	putCString(pci.busIdLegacy[:], formatLegacyBusID(r.g.domain, r.g.bus, 0))
	putCString(pci.busId[:], r.g.busID)
	pci.domain = C.uint(r.g.domain)
	pci.bus = C.uint(r.g.bus)
	pci.device = 0
	pci.pciDeviceId = C.uint(r.g.model.PciDeviceId)
	pci.pciSubSystemId = C.uint(r.g.model.PciDeviceId)
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), pci == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	fillPci(r, pci)
	return rcOK
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return nvmlDeviceGetPciInfo_v3(device, pci)
}

//export nvmlDeviceGetPciInfo
func nvmlDeviceGetPciInfo(device C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	return nvmlDeviceGetPciInfo_v3(device, pci)
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(device C.nvmlDevice_t, major *C.int, minor *C.int) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), major == nil || minor == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	a, b, _ := r.g.mock.GetCudaComputeCapability()
	*major, *minor = C.int(a), C.int(b)
	return rcOK
}

func memoryOf(r *ref) (total, used uint64, e rc) {
	// nvmlDeviceGetMemoryInfo: "NVML_ERROR_NOT_SUPPORTED if video memory is unsupported on the
	// device" (a unified-memory GPU without a dedicated framebuffer).
	if r.g.o.UnifiedMemory {
		return 0, 0, rcNotSupported
	}
	m, _ := r.g.mock.GetMemoryInfo()
	total = m.Total
	if r.mig {
		total = r.g.model.MIGProfiles.GpuInstanceProfiles[int(r.gi.ProfileID)].MemorySizeMB << 20
	}
	for _, p := range r.g.o.Processes {
		if !r.mig || (p.GpuInstanceID != nil && *p.GpuInstanceID == r.gi.ID) {
			used += p.UsedMemory
		}
	}
	if used > total {
		used = total
	}
	return total, used, rcOK
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(device C.nvmlDevice_t, memory *C.nvmlMemory_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), memory == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	total, used, e := memoryOf(r)
	if e != rcOK {
		return e
	}
	memory.total, memory.used, memory.free = C.ulonglong(total), C.ulonglong(used), C.ulonglong(total-used)
	return rcOK
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(device C.nvmlDevice_t, memory *C.nvmlMemory_v2_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), memory == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	if memory.version != C.uint(unsafe.Sizeof(*memory))|2<<24 {
		return rcVersion
	}
	total, used, e := memoryOf(r)
	if e != rcOK {
		return e
	}
	memory.total, memory.reserved = C.ulonglong(total), 0
	memory.used, memory.free = C.ulonglong(used), C.ulonglong(total-used)
	return rcOK
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(device C.nvmlDevice_t, attributes *C.nvmlDeviceAttributes_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), attributes == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	profiles := r.g.model.MIGProfiles
	var gp nvml.GpuInstanceProfileInfo
	var cp nvml.ComputeInstanceProfileInfo
	if r.mig {
		gp = profiles.GpuInstanceProfiles[int(r.gi.ProfileID)]
		cp = profiles.ComputeInstanceProfiles[int(r.gi.ProfileID)][int(r.ci.ProfileID)]
	} else {
		// The whole GPU: as large as its largest GPU instance profile.
		for id, p := range profiles.GpuInstanceProfiles {
			if p.SliceCount > gp.SliceCount {
				gp = p
				cp = nvml.ComputeInstanceProfileInfo{MultiprocessorCount: p.MultiprocessorCount, SliceCount: p.SliceCount}
				_ = id
			}
		}
		m, _ := r.g.mock.GetMemoryInfo()
		gp.MemorySizeMB = m.Total >> 20
	}
	*attributes = C.nvmlDeviceAttributes_t{
		multiprocessorCount:       C.uint(cp.MultiprocessorCount),
		sharedCopyEngineCount:     C.uint(gp.CopyEngineCount),
		sharedDecoderCount:        C.uint(gp.DecoderCount),
		sharedEncoderCount:        C.uint(gp.EncoderCount),
		sharedJpegCount:           C.uint(gp.JpegCount),
		sharedOfaCount:            C.uint(gp.OfaCount),
		gpuInstanceSliceCount:     C.uint(gp.SliceCount),
		computeInstanceSliceCount: C.uint(cp.SliceCount),
		memorySizeMB:              C.ulonglong(gp.MemorySizeMB),
	}
	return rcOK
}

//export nvmlDeviceGetAttributes
func nvmlDeviceGetAttributes(device C.nvmlDevice_t, attributes *C.nvmlDeviceAttributes_t) C.nvmlReturn_t {
	return nvmlDeviceGetAttributes_v2(device, attributes)
}

// --- telemetry ---------------------------------------------------------------------------------------

//export nvmlDeviceGetUtilizationRates
func nvmlDeviceGetUtilizationRates(device C.nvmlDevice_t, utilization *C.nvmlUtilization_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), utilization == nil, hDevice)
	if e != rcOK {
		return e
	}
	// "On MIG-enabled GPUs, querying device utilization rates is not currently supported."
	if r.st.MigMode == 1 {
		return rcNotSupported
	}
	utilization.gpu, utilization.memory = C.uint(r.g.o.GpuUtilization), C.uint(r.g.o.MemoryUtilization)
	return rcOK
}

//export nvmlDeviceGetPowerUsage
func nvmlDeviceGetPowerUsage(device C.nvmlDevice_t, power *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), power == nil, hDevice)
	if e != rcOK {
		return e
	}
	*power = 70000
	if r.g.o.PowerMilliwatts != nil {
		*power = C.uint(*r.g.o.PowerMilliwatts)
	}
	return rcOK
}

//export nvmlDeviceGetTemperature
func nvmlDeviceGetTemperature(device C.nvmlDevice_t, sensorType C.nvmlTemperatureSensors_t, temp *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), temp == nil || sensorType != C.NVML_TEMPERATURE_GPU, hDevice)
	if e != rcOK {
		return e
	}
	*temp = 34
	if r.g.o.TemperatureCelsius != nil {
		*temp = C.uint(*r.g.o.TemperatureCelsius)
	}
	return rcOK
}

//export nvmlDeviceGetTotalEccErrors
func nvmlDeviceGetTotalEccErrors(device C.nvmlDevice_t, errorType C.nvmlMemoryErrorType_t, counterType C.nvmlEccCounterType_t, eccCounts *C.ulonglong) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), eccCounts == nil || counterType >= C.NVML_ECC_COUNTER_TYPE_COUNT, hDevice)
	if e != rcOK {
		return e
	}
	switch errorType {
	case C.NVML_MEMORY_ERROR_TYPE_CORRECTED:
		*eccCounts = C.ulonglong(r.g.o.EccCorrected)
	case C.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
		*eccCounts = C.ulonglong(r.g.o.EccUncorrected)
	default:
		return rcInvalid
	}
	return rcOK
}

//export nvmlDeviceGetCurrentClocksEventReasons
func nvmlDeviceGetCurrentClocksEventReasons(device C.nvmlDevice_t, reasons *C.ulonglong) C.nvmlReturn_t {
	return get(unsafe.Pointer(device.handle), reasons, func(r *ref) C.ulonglong { return C.ulonglong(r.g.o.ThrottleReasons) }, hDevice)
}

//export nvmlDeviceGetCurrentClocksThrottleReasons
func nvmlDeviceGetCurrentClocksThrottleReasons(device C.nvmlDevice_t, reasons *C.ulonglong) C.nvmlReturn_t {
	return nvmlDeviceGetCurrentClocksEventReasons(device, reasons)
}

func processes(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_t, mps bool) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), infoCount == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	var list []Process
	for _, p := range r.g.o.Processes {
		if p.Mps == mps && (!r.mig || (p.GpuInstanceID != nil && *p.GpuInstanceID == r.gi.ID)) {
			list = append(list, p)
		}
	}
	// "NVML_ERROR_INSUFFICIENT_SIZE if infoCount indicates that the infos array is too small;
	// infoCount will contain minimal amount of space necessary for the call to complete".
	if uint(*infoCount) < uint(len(list)) {
		*infoCount = C.uint(len(list))
		return rcSize
	}
	*infoCount = C.uint(len(list))
	if len(list) == 0 {
		return rcOK
	}
	if infos == nil {
		return rcInvalid
	}
	out := unsafe.Slice(infos, len(list))
	for i, p := range list {
		gi, ci := instanceIDs(p.GpuInstanceID, p.ComputeInstanceID)
		out[i] = C.nvmlProcessInfo_t{pid: C.uint(p.Pid), usedGpuMemory: C.ulonglong(p.UsedMemory),
			gpuInstanceId: C.uint(gi), computeInstanceId: C.uint(ci)}
	}
	return rcOK
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	return processes(device, infoCount, infos, false)
}

//export nvmlDeviceGetComputeRunningProcesses_v2
func nvmlDeviceGetComputeRunningProcesses_v2(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_v2_t) C.nvmlReturn_t {
	return processes(device, infoCount, (*C.nvmlProcessInfo_t)(infos), false)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v3
func nvmlDeviceGetMPSComputeRunningProcesses_v3(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	return processes(device, infoCount, infos, true)
}

//export nvmlDeviceGetMPSComputeRunningProcesses_v2
func nvmlDeviceGetMPSComputeRunningProcesses_v2(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_v2_t) C.nvmlReturn_t {
	return processes(device, infoCount, (*C.nvmlProcessInfo_t)(infos), true)
}

//export nvmlDeviceGetGraphicsRunningProcesses_v3
func nvmlDeviceGetGraphicsRunningProcesses_v3(device C.nvmlDevice_t, infoCount *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	defer locked()()
	if _, e := resolveArgs(unsafe.Pointer(device.handle), infoCount == nil, hDevice, hMig); e != rcOK {
		return e
	}
	*infoCount = 0 // a headless compute GPU runs no graphics processes
	return rcOK
}

//export nvmlDeviceGetProcessUtilization
func nvmlDeviceGetProcessUtilization(device C.nvmlDevice_t, utilization *C.nvmlProcessUtilizationSample_t, processSamplesCount *C.uint, lastSeenTimeStamp C.ulonglong) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), processSamplesCount == nil, hDevice)
	if e != rcOK {
		return e
	}
	// "On MIG-enabled GPUs, querying process utilization is not currently supported."
	if r.st.MigMode == 1 {
		return rcNotSupported
	}
	// "One utilization sample structure is returned per process running, that had some non-zero
	// utilization during the last sample period", each sampled now; "Return only samples with
	// timestamp greater than lastSeenTimeStamp" (CPU microseconds).
	now := C.ulonglong(nowMicros())
	var sampled []Process
	for _, p := range r.g.o.Processes {
		if (p.SmUtil != 0 || p.MemUtil != 0) && now > lastSeenTimeStamp {
			sampled = append(sampled, p)
		}
	}
	n := len(sampled)
	// "If no valid sample entries are found since the lastSeenTimeStamp, NVML_ERROR_NOT_FOUND is returned."
	if n == 0 {
		return rcNotFound
	}
	// "utilization: Pointer to caller-supplied buffer ... If utilization is NULL, then
	// processSamplesCount returns the number of entries" with NVML_ERROR_INSUFFICIENT_SIZE.
	if utilization == nil || uint(*processSamplesCount) < uint(n) {
		*processSamplesCount = C.uint(n)
		return rcSize
	}
	out := unsafe.Slice(utilization, n)
	for i, p := range sampled {
		out[i] = C.nvmlProcessUtilizationSample_t{pid: C.uint(p.Pid), timeStamp: now, smUtil: C.uint(p.SmUtil), memUtil: C.uint(p.MemUtil)}
	}
	*processSamplesCount = C.uint(n)
	return rcOK
}

// --- compute mode, memory limits -------------------------------------------------------------------

//export nvmlDeviceGetComputeMode
func nvmlDeviceGetComputeMode(device C.nvmlDevice_t, mode *C.nvmlComputeMode_t) C.nvmlReturn_t {
	return get(unsafe.Pointer(device.handle), mode, func(r *ref) C.nvmlComputeMode_t { return C.nvmlComputeMode_t(r.st.ComputeMode) }, hDevice)
}

//export nvmlDeviceSetComputeMode
func nvmlDeviceSetComputeMode(device C.nvmlDevice_t, mode C.nvmlComputeMode_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if mode >= C.NVML_COMPUTEMODE_COUNT || mode == 1 { // 1 was EXCLUSIVE_THREAD, removed in CUDA 8
		return rcInvalid
	}
	return mutate(r, func(st *GPUState) rc { st.ComputeMode = int(mode); return rcOK })
}

//export nvmlDeviceSetMemoryLimits_v1
func nvmlDeviceSetMemoryLimits_v1(device C.nvmlDevice_t, limits *C.nvmlSetMemoryLimits_v1_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	// "@note MIG handles are not supported".
	if r.mig {
		return rcNotSupported
	}
	// "NVML_ERROR_INVALID_ARGUMENT if device is invalid, limits is NULL, the softLimit exceeds the
	// hardLimit, or a limit exceeds total device memory".
	if limits == nil || limits.nameSpace == nil {
		return rcInvalid
	}
	soft, hard := uint64(limits.softLimit), uint64(limits.hardLimit)
	ns := C.GoString(limits.nameSpace)
	// Every call that names a cgroup is recorded, refused ones too: a test sees what the caller asked.
	return recordLimitCall(r, ns, soft, hard, func(st *GPUState) rc {
		// "NVML_ERROR_NOT_SUPPORTED if the device does not support this feature" (memoryLimits: false).
		if !limitsSupported(r.g) {
			return rcNotSupported
		}
		m, _ := r.g.mock.GetMemoryInfo()
		clear := soft == 0 && hard == ^uint64(0) // "To clear the limits, set softLimit to 0, and hardLimit to NVML_DEVICE_MEMORY_LIMIT_MAX"
		if !clear && (soft > hard || hard > m.Total) {
			return rcInvalid
		}
		// "NVML_ERROR_OPERATING_SYSTEM if the cgroup path cannot be opened".
		if _, err := os.Stat(ns); err != nil {
			delete(st.MemoryLimits, ns) // a gone cgroup holds no limit
			return rcOS
		}
		if clear {
			delete(st.MemoryLimits, ns)
			return rcOK
		}
		if st.MemoryLimits == nil {
			st.MemoryLimits = map[string]MemoryLimit{}
		}
		st.MemoryLimits[ns] = MemoryLimit{Soft: soft, Hard: hard}
		return rcOK
	})
}

//export nvmlDeviceGetMemoryLimits_v1
func nvmlDeviceGetMemoryLimits_v1(device C.nvmlDevice_t, limits *C.nvmlGetMemoryLimits_v1_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	if r.mig {
		return rcNotSupported
	}
	if limits == nil || limits.nameSpace == nil {
		return rcInvalid
	}
	if !limitsSupported(r.g) {
		return rcNotSupported
	}
	ns := C.GoString(limits.nameSpace)
	if _, err := os.Stat(ns); err != nil {
		// "Removing the cgroup will also clear any limits": a limit of a cgroup that is gone is
		// dropped when it is asked for, as the driver has dropped it by then.
		if _, held := r.st.MemoryLimits[ns]; held {
			_ = mutateState(cur.cfg.StateFile, func(s *State) bool {
				if st := s.GPUs[r.g.uuid]; st != nil {
					delete(st.MemoryLimits, ns)
				}
				return true
			})
		}
		return rcOS
	}
	// "NVML_ERROR_NOT_FOUND if the limits were not found for this device and cgroup".
	lim, ok := r.st.MemoryLimits[ns]
	if !ok {
		return rcNotFound
	}
	limits.softLimit, limits.hardLimit, limits.currentUsed = C.ulonglong(lim.Soft), C.ulonglong(lim.Hard), 0
	return rcOK
}
