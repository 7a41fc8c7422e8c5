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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if currentMode == nil || pendingMode == nil {
		return rcInvalid
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

// migCapable: the model has MIG profiles ("NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG mode").
func migCapable(g *gpu) bool { return len(g.model.MIGProfiles.GpuInstanceProfiles) > 0 }

// needsResetForMig: a GPU older than Hopper changes MIG mode only at a GPU reset.
func needsResetForMig(g *gpu) bool {
	a, _ := g.mock.GetArchitecture()
	return a < nvml.DEVICE_ARCH_HOPPER
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
	}
	// Answered with MIG mode off too: "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or
	// profile isn't supported" (nvml.h, nvmlDeviceGetGpuInstanceProfileInfo); the profiles of a GPU
	// are fixed ("immutable throughout the lifetime of a MIG mode"), not created by MIG mode.
	if !migCapable(r.g) {
		return rcNotSupported
	}
	p, e := giProfile(r.g, uint32(profile))
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
	}
	// The "versioned wrapper around nvmlDeviceGetGpuInstanceProfileInfo" answers as what it wraps,
	// with MIG mode off too: "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or profile isn't
	// supported". (Its own doc line reads "doesn't have MIG mode enabled", copied from the create
	// calls; pynvml's nvmlDeviceGetGpuInstanceProfileInfo calls this one, and nvidia-smi mig -lgip
	// lists the profiles of a GPU with MIG mode off.)
	if !migCapable(r.g) {
		return rcNotSupported
	}
	p, e := giProfile(r.g, uint32(profile))
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if count == nil {
		return rcInvalid
	}
	// "This API only returns all the possible placements for the given profile regardless of whether
	// MIG is enabled or not"; "NVML_ERROR_NOT_SUPPORTED If device doesn't support MIG or profileId
	// isn't supported" (nvml.h, nvmlDeviceGetGpuInstancePossiblePlacements_v2).
	if !migCapable(r.g) {
		return rcNotSupported
	}
	p, e := giProfile(r.g, uint32(profileId))
	if e != rcOK {
		return e
	}
	list, _ := r.g.mock.GetGpuInstancePossiblePlacements(&p)
	// "placements: ... Can be NULL to discover number of allowed placements for this profile. If
	// non-NULL must be large enough to accommodate the placements supported by the profile."
	*count = C.uint(len(list))
	if placements == nil || len(list) == 0 {
		return rcOK
	}
	out := unsafe.Slice(placements, len(list))
	for i, pl := range list {
		out[i] = C.nvmlGpuInstancePlacement_t{start: C.uint(pl.Start), size: C.uint(pl.Size)}
	}
	return rcOK
}

//export nvmlDeviceGetGpuInstancePossiblePlacements
func nvmlDeviceGetGpuInstancePossiblePlacements(device C.nvmlDevice_t, profileId C.uint, placements *C.nvmlGpuInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count)
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(device C.nvmlDevice_t, profileId C.uint, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if count == nil {
		return rcInvalid
	}
	if e := migOn(r); e != rcOK {
		return e
	}
	if _, e := giProfile(r.g, uint32(profileId)); e != rcOK {
		return rcInvalid
	}
	n := 0
	for { // how many more fit: create on a scratch copy until it fails
		if _, e := createGI(r.g, r.st, uint32(profileId), nil); e != rcOK {
			break
		}
		n++
	}
	*count = C.uint(n)
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if gpuInstance == nil {
		return rcInvalid
	}
	return newGI(r, profileId, nil, gpuInstance)
}

//export nvmld_DeviceCreateGpuInstanceWithPlacement
func nvmld_DeviceCreateGpuInstanceWithPlacement(device C.nvmlDevice_t, profileId C.uint, placement *C.nvmlGpuInstancePlacement_t, gpuInstance *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if placement == nil || gpuInstance == nil {
		return rcInvalid
	}
	// The placement is read through the pointer the caller gave, as the C library reads it: a
	// structure passed by value arrives here as its bytes taken for an address, and faults.
	want := nvml.GpuInstancePlacement{Start: uint32(placement.start), Size: uint32(placement.size)}
	return newGI(r, profileId, &want, gpuInstance)
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(device C.nvmlDevice_t, profileId C.uint, gpuInstances *C.nvmlGpuInstance_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if count == nil || gpuInstances == nil {
		return rcInvalid
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
	*count = C.uint(len(ids))
	if len(ids) > 0 {
		out := unsafe.Slice(gpuInstances, len(ids))
		for i, id := range ids {
			out[i] = giH(issue(hGI, r.g.cfgIndex, id, 0))
		}
	}
	return rcOK
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(device C.nvmlDevice_t, id C.uint, gpuInstance *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if gpuInstance == nil {
		return rcInvalid
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
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
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
		for i, g := range st.GpuInstances {
			if g == gi {
				st.GpuInstances = append(st.GpuInstances[:i], st.GpuInstances[i+1:]...)
				break
			}
		}
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
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
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
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
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
	switch v {
	case C.uint(unsafe.Sizeof(C.nvmlComputeInstanceProfileInfo_v2_t{})) | 2<<24:
		*info = C.nvmlComputeInstanceProfileInfo_v2_t{version: v, id: C.uint(p.Id), sliceCount: C.uint(p.SliceCount),
			instanceCount: C.uint(p.InstanceCount), multiprocessorCount: C.uint(p.MultiprocessorCount),
			sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount), sharedDecoderCount: C.uint(p.SharedDecoderCount),
			sharedEncoderCount: C.uint(p.SharedEncoderCount), sharedJpegCount: C.uint(p.SharedJpegCount),
			sharedOfaCount: C.uint(p.SharedOfaCount)}
		putCString(info.name[:], "MIG "+name)
	case C.uint(unsafe.Sizeof(C.nvmlComputeInstanceProfileInfo_v3_t{})) | 3<<24:
		v3 := (*C.nvmlComputeInstanceProfileInfo_v3_t)(unsafe.Pointer(info))
		*v3 = C.nvmlComputeInstanceProfileInfo_v3_t{version: v, id: C.uint(p.Id), sliceCount: C.uint(p.SliceCount),
			instanceCount: C.uint(p.InstanceCount), multiprocessorCount: C.uint(p.MultiprocessorCount),
			sharedCopyEngineCount: C.uint(p.SharedCopyEngineCount), sharedDecoderCount: C.uint(p.SharedDecoderCount),
			sharedEncoderCount: C.uint(p.SharedEncoderCount), sharedJpegCount: C.uint(p.SharedJpegCount),
			sharedOfaCount: C.uint(p.SharedOfaCount)}
		putCString(v3.name[:], "MIG "+name)
	default:
		return rcInvalid
	}
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstancePossiblePlacements
func nvmlGpuInstanceGetComputeInstancePossiblePlacements(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, placements *C.nvmlComputeInstancePlacement_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if count == nil {
		return rcInvalid
	}
	if _, e := ciProfile(r.g, r.gi.ProfileID, uint32(profileId), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); e != rcOK {
		return rcInvalid
	}
	list := ciPlacements(r.g, r.gi.ProfileID, uint32(profileId))
	*count = C.uint(len(list))
	if placements == nil || len(list) == 0 {
		return rcOK
	}
	out := unsafe.Slice(placements, len(list))
	for i, pl := range list {
		out[i] = C.nvmlComputeInstancePlacement_t{start: C.uint(pl.Start), size: C.uint(pl.Size)}
	}
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if count == nil {
		return rcInvalid
	}
	if _, e := ciProfile(r.g, r.gi.ProfileID, uint32(profileId), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); e != rcOK {
		return rcInvalid
	}
	n := 0
	for {
		if _, e := createCI(r.g, r.gi, uint32(profileId), nil); e != rcOK {
			break
		}
		n++
	}
	*count = C.uint(n)
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
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if computeInstance == nil {
		return rcInvalid
	}
	return newCI(r, profileId, nil, computeInstance)
}

//export nvmld_GpuInstanceCreateComputeInstanceWithPlacement
func nvmld_GpuInstanceCreateComputeInstanceWithPlacement(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, placement *C.nvmlComputeInstancePlacement_t, computeInstance *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if placement == nil || computeInstance == nil {
		return rcInvalid
	}
	start := uint32(placement.start) // read through the pointer, as C reads it
	return newCI(r, profileId, &start, computeInstance)
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(gpuInstance C.nvmlGpuInstance_t, profileId C.uint, computeInstances *C.nvmlComputeInstance_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if count == nil || computeInstances == nil {
		return rcInvalid
	}
	var ids []uint32
	for _, ci := range r.gi.ComputeInstances {
		if ci.ProfileID == uint32(profileId) {
			ids = append(ids, ci.ID)
		}
	}
	*count = C.uint(len(ids))
	if len(ids) > 0 {
		out := unsafe.Slice(computeInstances, len(ids))
		for i, id := range ids {
			out[i] = ciH(issue(hCI, r.g.cfgIndex, r.gi.ID, id))
		}
	}
	return rcOK
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(gpuInstance C.nvmlGpuInstance_t, id C.uint, computeInstance *C.nvmlComputeInstance_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(gpuInstance.handle), hGI)
	if e != rcOK {
		return e
	}
	if computeInstance == nil {
		return rcInvalid
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
	r, e := resolve(unsafe.Pointer(computeInstance.handle), hCI)
	if e != rcOK {
		return e
	}
	if info == nil {
		return rcInvalid
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
		for i, ci := range gi.ComputeInstances {
			if ci.ID == r.ci.ID {
				gi.ComputeInstances = append(gi.ComputeInstances[:i], gi.ComputeInstances[i+1:]...)
				break
			}
		}
		return rcOK
	})
}

// --- MIG device handles ------------------------------------------------------------------------------

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(device C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if count == nil {
		return rcInvalid
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	if migDevice == nil {
		return rcInvalid
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
	defer locked()()
	r, e := resolve(unsafe.Pointer(migDevice.handle), hMig)
	if e != rcOK {
		return e
	}
	if device == nil {
		return rcInvalid
	}
	*device = devH(issue(hDevice, r.g.cfgIndex, 0, 0))
	return rcOK
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(device C.nvmlDevice_t, isMigDevice *C.uint) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	if isMigDevice == nil {
		return rcInvalid
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
	r, e := resolve(unsafe.Pointer(device.handle), hDevice, hMig)
	if e != rcOK {
		return e
	}
	if id == nil {
		return rcInvalid
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
