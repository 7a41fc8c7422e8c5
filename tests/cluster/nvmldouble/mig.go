package main

// MIG: mode, GPU instances, compute instances, MIG device handles.

/*
#include <stdlib.h>
#include "nvml.h"
*/
import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(device C.nvmlDevice_t, currentMode *C.uint, pendingMode *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), currentMode == nil || pendingMode == nil, hDevice)
	if e != rcOK {
		return e
	}
	if !migCapable(r.g) {
		return rcNotSupported
	}
	*currentMode, *pendingMode = C.uint(r.st.MigMode), C.uint(r.st.MigModePending)
	return rcOK
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(device C.nvmlDevice_t, mode C.uint, activationStatus *C.nvmlReturn_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	// "NVML_ERROR_INVALID_ARGUMENT If device, mode or activationStatus are invalid".
	if activationStatus == nil || mode > 1 {
		return rcInvalid
	}
	if !migCapable(r.g) {
		return rcNotSupported
	}
	status := rcOK
	e = mutate(r, func(st *GPUState) rc {
		// nvmlDeviceGetMigMode: 'The "pending" MIG mode refers to the target mode following the next
		// activation trigger'. Setting it is what the call always does.
		st.MigModePending = int(mode)
		// "activationStatus would return the appropriate error code upon unsuccessful activation.
		// For example, if device unbind fails because the device isn't idle, NVML_ERROR_IN_USE".
		if int(mode) != st.MigMode && (len(st.GpuInstances) > 0 || len(r.g.o.Processes) > 0) {
			status = rcInUse
			return rcOK
		}
		// "This API may unbind or reset the device to activate the requested mode ... activationStatus
		// would return NVML_ERROR_RESET_REQUIRED for such cases." Ampere (A100, A30) needs a GPU reset
		// to change MIG mode; Hopper and later switch without one (NVIDIA's MIG user guide). The
		// pending mode becomes current at a reset: `resetAtInit` in the configuration.
		if int(mode) != st.MigMode && needsResetForMig(r.g) {
			status = rcResetRequired
			return rcOK
		}
		st.MigMode = int(mode)
		return rcOK
	})
	*activationStatus = status
	return e
}

// putList writes what a list call returns: the count always, the items when the caller's array is
// not NULL ("Can be NULL to discover number"), each converted to its C type.
func putList[S, D any](dst *D, count *C.uint, list []S, conv func(S) D) {
	*count = C.uint(len(list))
	if dst == nil || len(list) == 0 {
		return
	}
	out := unsafe.Slice(dst, len(list))
	for i, v := range list {
		out[i] = conv(v)
	}
}

// fits counts how many more creations succeed, creating on a scratch copy of the state until one fails.
func fits(create func() rc) C.uint {
	n := 0
	for create() == rcOK {
		n++
	}
	return C.uint(n)
}

// removeFirst removes v, compared as a pointer, from s.
func removeFirst[T any](s []*T, v *T) []*T {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// migCapable: the model has MIG profiles ("NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG mode").
func migCapable(g *gpu) bool { return len(g.model.MIGProfiles.GpuInstanceProfiles) > 0 }

// needsResetForMig: a GPU older than Hopper changes MIG mode only at a GPU reset.
func needsResetForMig(g *gpu) bool {
	a, _ := g.mock.GetArchitecture()
	return a < nvml.DEVICE_ARCH_HOPPER
}

// capableGIProfile is a GPU instance profile of a MIG-capable GPU, whatever its MIG mode: "NVML_ERROR_NOT_SUPPORTED If
// device doesn't support MIG or profile isn't supported".
func capableGIProfile(g *gpu, id uint32) (nvml.GpuInstanceProfileInfo, rc) {
	if !migCapable(g) {
		return nvml.GpuInstanceProfileInfo{}, rcNotSupported
	}
	return giProfile(g, id)
}

func migOn(r *ref) rc {
	// The GPU instance functions: "NVML_ERROR_NOT_SUPPORTED If device doesn't have MIG mode enabled".
	if r.st.MigMode != 1 {
		return rcNotSupported
	}
	return rcOK
}

func fillGIProfile(info nvml.GpuInstanceProfileInfo, id uint32) (name string) {
	return "MIG " + profileName(int(id), info)
}

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(device C.nvmlDevice_t, profile C.uint, info *C.nvmlGpuInstanceProfileInfo_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), info == nil, hDevice)
	if e != rcOK {
		return e
	}
	// Answered with MIG mode off too: "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or
	// profile isn't supported" (nvml.h, nvmlDeviceGetGpuInstanceProfileInfo); the profiles of a GPU
	// are fixed ("immutable throughout the lifetime of a MIG mode"), not created by MIG mode.
	p, e := capableGIProfile(r.g, uint32(profile))
	if e != rcOK {
		return e
	}
	*info = C.nvmlGpuInstanceProfileInfo_t{id: C.uint(p.Id), isP2pSupported: C.uint(p.IsP2pSupported),
		sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
		multiprocessorCount: C.uint(p.MultiprocessorCount), copyEngineCount: C.uint(p.CopyEngineCount),
		decoderCount: C.uint(p.DecoderCount), encoderCount: C.uint(p.EncoderCount), jpegCount: C.uint(p.JpegCount),
		ofaCount: C.uint(p.OfaCount), memorySizeMB: C.ulonglong(p.MemorySizeMB)}
	return rcOK
}

//export nvmlDeviceGetGpuInstanceProfileInfoV
func nvmlDeviceGetGpuInstanceProfileInfoV(device C.nvmlDevice_t, profile C.uint, info *C.nvmlGpuInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), info == nil, hDevice)
	if e != rcOK {
		return e
	}
	// The "versioned wrapper around nvmlDeviceGetGpuInstanceProfileInfo" answers as what it wraps,
	// with MIG mode off too: "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or profile isn't
	// supported". (Its own doc line reads "doesn't have MIG mode enabled", copied from the create
	// calls; pynvml's nvmlDeviceGetGpuInstanceProfileInfo calls this one, and nvidia-smi mig -lgip
	// lists the profiles of a GPU with MIG mode off.)
	p, e := capableGIProfile(r.g, uint32(profile))
	if e != rcOK {
		return e
	}
	name := fillGIProfile(p, uint32(profile))
	// The structure's version picks its layout: v2 has isP2pSupported, v3 has capabilities instead
	// ("NVML_ERROR_INVALID_ARGUMENT If device, profile, info, or info->version are invalid").
	switch info.version {
	case C.uint(unsafe.Sizeof(C.nvmlGpuInstanceProfileInfo_v2_t{})) | 2<<24:
		*info = C.nvmlGpuInstanceProfileInfo_v2_t{version: info.version, id: C.uint(p.Id), isP2pSupported: C.uint(p.IsP2pSupported),
			sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
			multiprocessorCount: C.uint(p.MultiprocessorCount), copyEngineCount: C.uint(p.CopyEngineCount),
			decoderCount: C.uint(p.DecoderCount), encoderCount: C.uint(p.EncoderCount), jpegCount: C.uint(p.JpegCount),
			ofaCount: C.uint(p.OfaCount), memorySizeMB: C.ulonglong(p.MemorySizeMB)}
		putCString(info.name[:], name)
	case C.uint(unsafe.Sizeof(C.nvmlGpuInstanceProfileInfo_v3_t{})) | 3<<24:
		v3 := (*C.nvmlGpuInstanceProfileInfo_v3_t)(unsafe.Pointer(info))
		caps := C.uint(0)
		if p.IsP2pSupported != 0 {
			caps |= C.NVML_GPU_INSTANCE_PROFILE_CAPS_P2P
		}
		*v3 = C.nvmlGpuInstanceProfileInfo_v3_t{version: v3.version, id: C.uint(p.Id),
			sliceCount: C.uint(p.SliceCount), instanceCount: C.uint(p.InstanceCount),
			multiprocessorCount: C.uint(p.MultiprocessorCount), copyEngineCount: C.uint(p.CopyEngineCount),
			decoderCount: C.uint(p.DecoderCount), encoderCount: C.uint(p.EncoderCount), jpegCount: C.uint(p.JpegCount),
			ofaCount: C.uint(p.OfaCount), memorySizeMB: C.ulonglong(p.MemorySizeMB), capabilities: caps}
		putCString(v3.name[:], name)
	default:
		return rcInvalid
	}
	return rcOK
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(device C.nvmlDevice_t, profileId C.uint, placements *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), count == nil, hDevice)
	if e != rcOK {
		return e
	}
	// "This API only returns all the possible placements for the given profile regardless of whether
	// MIG is enabled or not"; "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or profileId
	// isn't supported" (nvml.h, nvmlDeviceGetGpuInstancePossiblePlacements_v2).
	p, e := capableGIProfile(r.g, uint32(profileId))
	if e != rcOK {
		return e
	}
	list, _ := r.g.mock.GetGpuInstancePossiblePlacements(&p)
	// "placements: ... Can be NULL to discover number of allowed placements for this profile. If
	// non-NULL must be large enough to accommodate the placements supported by the profile."
	putList(placements, count, list, func(pl nvml.GpuInstancePlacement) C.nvmlGpuInstancePlacement_t {
		return C.nvmlGpuInstancePlacement_t{start: C.uint(pl.Start), size: C.uint(pl.Size)}
	})
	return rcOK
}

//export nvmlDeviceGetGpuInstancePossiblePlacements
func nvmlDeviceGetGpuInstancePossiblePlacements(device C.nvmlDevice_t, profileId C.uint, placements *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count)
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(device C.nvmlDevice_t, profileId C.uint, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), count == nil, hDevice)
	if e != rcOK {
		return e
	}
	if e := migOn(r); e != rcOK {
		return e
	}
	if _, e := giProfile(r.g, uint32(profileId)); e != rcOK {
		return rcInvalid
	}
	// r.st is this call's own copy of the state: nothing created here is written back.
	*count = fits(func() rc { _, e := createGI(r.g, r.st, uint32(profileId), nil); return e })
	return rcOK
}

func newGI(r *ref, profileId C.uint, want *nvml.GpuInstancePlacement, gpuInstance *C.nvmlGpuInstance_t) rc {
	if e := migOn(r); e != rcOK {
		return e
	}
	var created *GIState
	e := mutate(r, func(st *GPUState) rc {
		gi, e := createGI(r.g, st, uint32(profileId), want)
		created = gi
		return e
	})
	if e == rcOK {
		*gpuInstance = giH(issue(hGI, r.g.cfgIndex, created.ID, 0))
	}
	return e
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(device C.nvmlDevice_t, profileId C.uint, gpuInstance *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), gpuInstance == nil, hDevice)
	if e != rcOK {
		return e
	}
	return newGI(r, profileId, nil, gpuInstance)
}

//export nvmld_DeviceCreateGpuInstanceWithPlacement
func nvmld_DeviceCreateGpuInstanceWithPlacement(device C.nvmlDevice_t, profileId C.uint, placement *C.nvmlGpuInstancePlacement_t, gpuInstance *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), placement == nil || gpuInstance == nil, hDevice)
	if e != rcOK {
		return e
	}
	// The placement is read through the pointer the caller gave, as the C library reads it: a
	// structure passed by value arrives here as its bytes taken for an address, and faults.
	want := nvml.GpuInstancePlacement{Start: uint32(placement.start), Size: uint32(placement.size)}
	return newGI(r, profileId, &want, gpuInstance)
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(device C.nvmlDevice_t, profileId C.uint, gpuInstances *C.nvmlGpuInstance_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), count == nil || gpuInstances == nil, hDevice)
	if e != rcOK {
		return e
	}
	if e := migOn(r); e != rcOK {
		return e
	}
	if _, e := giProfile(r.g, uint32(profileId)); e != rcOK {
		return rcInvalid
	}
	var ids []uint32
	for _, gi := range r.st.GpuInstances {
		if gi.ProfileID == uint32(profileId) {
			ids = append(ids, gi.ID)
		}
	}
	putList(gpuInstances, count, ids, func(id uint32) C.nvmlGpuInstance_t { return giH(issue(hGI, r.g.cfgIndex, id, 0)) })
	return rcOK
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device C.nvmlDevice_t, id C.uint, gpuInstance *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), gpuInstance == nil, hDevice)
	if e != rcOK {
		return e
	}
	if e := migOn(r); e != rcOK {
		return e
	}
	// "NVML_ERROR_NOT_FOUND If the GPU instance is not found."
	if r.st.gi(uint32(id)) == nil {
		return rcNotFound
	}
	*gpuInstance = giH(issue(hGI, r.g.cfgIndex, uint32(id), 0))
	return rcOK
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(gpuInstance C.nvmlGpuInstance_t, info *C.nvmlGpuInstanceInfo_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), info == nil, hGI)
	if e != rcOK {
		return e
	}
	*info = C.nvmlGpuInstanceInfo_t{device: devH(issue(hDevice, r.g.cfgIndex, 0, 0)), id: C.uint(r.gi.ID),
		profileId: C.uint(r.gi.ProfileID), placement: C.nvmlGpuInstancePlacement_t{start: C.uint(r.gi.Start), size: C.uint(r.gi.Size)}}
	return rcOK
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(gpuInstance C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	return mutate(r, func(st *GPUState) rc {
		gi := st.gi(r.gi.ID)
		if gi == nil {
			return rcInvalid
		}
		// "NVML_ERROR_IN_USE If the GPU instance is in use. This error would be returned if
		// processes (e.g. CUDA application) or compute instances are active on the GPU instance."
		if len(gi.ComputeInstances) > 0 {
			return rcInUse
		}
		st.GpuInstances = removeFirst(st.GpuInstances, gi)
		return rcOK
	})
}

func fillCIProfile(p nvml.ComputeInstanceProfileInfo) C.nvmlComputeInstanceProfileInfo_t {
	return C.nvmlComputeInstanceProfileInfo_t{id: C.uint(p.Id), sliceCount: C.uint(p.SliceCount),
		instanceCount: C.uint(p.InstanceCount), multiprocessorCount: C.uint(p.MultiprocessorCount),
		sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount), sharedDecoderCount: C.uint(p.SharedDecoderCount),
		sharedEncoderCount: C.uint(p.SharedEncoderCount), sharedJpegCount: C.uint(p.SharedJpegCount),
		sharedOfaCount: C.uint(p.SharedOfaCount)}
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(gpuInstance C.nvmlGpuInstance_t, profile C.uint, engProfile C.uint, info *C.nvmlComputeInstanceProfileInfo_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), info == nil, hGI)
	if e != rcOK {
		return e
	}
	p, e := ciProfile(r.g, r.gi.ProfileID, uint32(profile), uint32(engProfile))
	if e != rcOK {
		return e
	}
	*info = fillCIProfile(p)
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfoV
func nvmlGpuInstanceGetComputeInstanceProfileInfoV(gpuInstance C.nvmlGpuInstance_t, profile C.uint, engProfile C.uint, info *C.nvmlComputeInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), info == nil, hGI)
	if e != rcOK {
		return e
	}
	p, e := ciProfile(r.g, r.gi.ProfileID, uint32(profile), uint32(engProfile))
	if e != rcOK {
		return e
	}
	gp := r.g.model.MIGProfiles.GpuInstanceProfiles[int(r.gi.ProfileID)]
	name := profileName(int(r.gi.ProfileID), gp)
	if p.SliceCount != gp.SliceCount {
		name = itoa(p.SliceCount) + "c." + name
	}
	v := info.version
	v3 := v == C.uint(unsafe.Sizeof(C.nvmlComputeInstanceProfileInfo_v3_t{}))|3<<24
	if v != C.uint(unsafe.Sizeof(C.nvmlComputeInstanceProfileInfo_v2_t{}))|2<<24 && !v3 {
		return rcInvalid
	}
	// nvml.h's v3 is v2 with capabilities appended (same fields, same offsets): one fill serves both.
	c := fillCIProfile(p)
	*info = C.nvmlComputeInstanceProfileInfo_v2_t{version: v, id: c.id, sliceCount: c.sliceCount,
		instanceCount: c.instanceCount, multiprocessorCount: c.multiprocessorCount,
		sharedCopyEngineCount: c.sharedCopyEngineCount, sharedDecoderCount: c.sharedDecoderCount,
		sharedEncoderCount: c.sharedEncoderCount, sharedJpegCount: c.sharedJpegCount, sharedOfaCount: c.sharedOfaCount}
	putCString(info.name[:], "MIG "+name)
	if v3 {
		(*C.nvmlComputeInstanceProfileInfo_v3_t)(unsafe.Pointer(info)).capabilities = 0
	}
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstancePossiblePlacements
func nvmlGpuInstanceGetComputeInstancePossiblePlacements(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, placements *C.nvmlComputeInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), count == nil, hGI)
	if e != rcOK {
		return e
	}
	if _, e := ciProfile(r.g, r.gi.ProfileID, uint32(profileId), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); e != rcOK {
		return rcInvalid
	}
	list := ciPlacements(r.g, r.gi.ProfileID, uint32(profileId))
	putList(placements, count, list, func(pl nvml.ComputeInstancePlacement) C.nvmlComputeInstancePlacement_t {
		return C.nvmlComputeInstancePlacement_t{start: C.uint(pl.Start), size: C.uint(pl.Size)}
	})
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), count == nil, hGI)
	if e != rcOK {
		return e
	}
	if _, e := ciProfile(r.g, r.gi.ProfileID, uint32(profileId), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); e != rcOK {
		return rcInvalid
	}
	*count = fits(func() rc { _, e := createCI(r.g, r.gi, uint32(profileId), nil); return e })
	return rcOK
}

func newCI(r *ref, profileId C.uint, start *uint32, computeInstance *C.nvmlComputeInstance_t) rc {
	var created *CIState
	e := mutate(r, func(st *GPUState) rc {
		gi := st.gi(r.gi.ID)
		if gi == nil {
			return rcInvalid
		}
		ci, e := createCI(r.g, gi, uint32(profileId), start)
		created = ci
		return e
	})
	if e == rcOK {
		*computeInstance = ciH(issue(hCI, r.g.cfgIndex, r.gi.ID, created.ID))
	}
	return e
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, computeInstance *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), computeInstance == nil, hGI)
	if e != rcOK {
		return e
	}
	return newCI(r, profileId, nil, computeInstance)
}

//export nvmld_GpuInstanceCreateComputeInstanceWithPlacement
func nvmld_GpuInstanceCreateComputeInstanceWithPlacement(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, placement *C.nvmlComputeInstancePlacement_t, computeInstance *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), placement == nil || computeInstance == nil, hGI)
	if e != rcOK {
		return e
	}
	start := uint32(placement.start) // read through the pointer, as C reads it
	return newCI(r, profileId, &start, computeInstance)
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, computeInstances *C.nvmlComputeInstance_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), count == nil || computeInstances == nil, hGI)
	if e != rcOK {
		return e
	}
	var ids []uint32
	for _, ci := range r.gi.ComputeInstances {
		if ci.ProfileID == uint32(profileId) {
			ids = append(ids, ci.ID)
		}
	}
	putList(computeInstances, count, ids, func(id uint32) C.nvmlComputeInstance_t { return ciH(issue(hCI, r.g.cfgIndex, r.gi.ID, id)) })
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(gpuInstance C.nvmlGpuInstance_t, id C.uint, computeInstance *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(gpuInstance.handle), computeInstance == nil, hGI)
	if e != rcOK {
		return e
	}
	// "NVML_ERROR_NOT_FOUND If the compute instance is not found."
	if r.gi.ci(uint32(id)) == nil {
		return rcNotFound
	}
	*computeInstance = ciH(issue(hCI, r.g.cfgIndex, r.gi.ID, uint32(id)))
	return rcOK
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(computeInstance C.nvmlComputeInstance_t, info *C.nvmlComputeInstanceInfo_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(computeInstance.handle), info == nil, hCI)
	if e != rcOK {
		return e
	}
	// The info's device is the MIG device this compute instance makes (nvidia-smi and the plugin
	// read its UUID through it).
	*info = C.nvmlComputeInstanceInfo_t{
		device:      devH(issue(hMig, r.g.cfgIndex, r.gi.ID, r.ci.ID)),
		gpuInstance: giH(issue(hGI, r.g.cfgIndex, r.gi.ID, 0)),
		id:          C.uint(r.ci.ID), profileId: C.uint(r.ci.ProfileID),
		placement: C.nvmlComputeInstancePlacement_t{start: C.uint(r.ci.Start), size: C.uint(r.ci.Size)},
	}
	return rcOK
}

//export nvmlComputeInstanceGetInfo
func nvmlComputeInstanceGetInfo(computeInstance C.nvmlComputeInstance_t, info *C.nvmlComputeInstanceInfo_t) C.nvmlReturn_t {
	return nvmlComputeInstanceGetInfo_v2(computeInstance, info)
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(computeInstance C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(computeInstance.handle), hCI)
	if e != rcOK {
		return e
	}
	return mutate(r, func(st *GPUState) rc {
		gi := st.gi(r.gi.ID)
		if gi == nil || gi.ci(r.ci.ID) == nil {
			return rcInvalid
		}
		gi.ComputeInstances = removeFirst(gi.ComputeInstances, gi.ci(r.ci.ID))
		return rcOK
	})
}

// --- MIG device handles ------------------------------------------------------------------------------

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), count == nil, hDevice)
	if e != rcOK {
		return e
	}
	// "Returns zero if MIG is not supported or enabled."
	*count = 0
	if r.st.MigMode == 1 {
		*count = C.uint(maxMigDevices(r.g))
	}
	return rcOK
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(device C.nvmlDevice_t, index C.uint, migDevice *C.nvmlDevice_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), migDevice == nil, hDevice)
	if e != rcOK {
		return e
	}
	if e := migOn(r); e != rcOK {
		return e
	}
	// "NVML_ERROR_INVALID_ARGUMENT if device, index or migDevice reference is invalid".
	if uint32(index) >= maxMigDevices(r.g) {
		return rcInvalid
	}
	for _, gi := range r.st.GpuInstances {
		for _, ci := range gi.ComputeInstances {
			if migIndex(gi, ci) == uint32(index) {
				*migDevice = devH(issue(hMig, r.g.cfgIndex, gi.ID, ci.ID))
				return rcOK
			}
		}
	}
	// "NVML_ERROR_NOT_FOUND if no valid MIG device was found at index".
	return rcNotFound
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice C.nvmlDevice_t, device *C.nvmlDevice_t) C.nvmlReturn_t {
	return get(unsafe.Pointer(migDevice.handle), device, func(r *ref) C.nvmlDevice_t { return devH(issue(hDevice, r.g.cfgIndex, 0, 0)) }, hMig)
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device C.nvmlDevice_t, isMigDevice *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolveArgs(unsafe.Pointer(device.handle), isMigDevice == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	*isMigDevice = 0
	if r.mig {
		*isMigDevice = 1
	}
	return rcOK
}

func migID(device C.nvmlDevice_t, id *C.uint, ci bool) rc {
	defer locked()()
	lookupKind := hkind(0)
	if h := lookup(unsafe.Pointer(device.handle)); h != nil {
		lookupKind = h.kind
	}
	r, e := resolveArgs(unsafe.Pointer(device.handle), id == nil, hDevice, hMig)
	if e != rcOK {
		return e
	}
	// "NVML_ERROR_NOT_SUPPORTED if this query is not supported by the device": a full GPU has none.
	if lookupKind != hMig {
		return rcNotSupported
	}
	if ci {
		*id = C.uint(r.ci.ID)
	} else {
		*id = C.uint(r.gi.ID)
	}
	return rcOK
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return migID(device, id, false)
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(device C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return migID(device, id, true)
}
