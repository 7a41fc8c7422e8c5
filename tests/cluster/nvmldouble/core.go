package main

// The library's bookkeeping: init refcount, configuration reloads, the handles it hands out,
// and the MIG operations on the shared state.

/*
#cgo CFLAGS: -DNVML_NO_UNVERSIONED_FUNC_DEFS -Wno-deprecated-declarations
#include <stdlib.h>
#include "nvml.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

type rc = C.nvmlReturn_t

const (
	rcOK            rc = C.NVML_SUCCESS
	rcUninit        rc = C.NVML_ERROR_UNINITIALIZED
	rcInvalid       rc = C.NVML_ERROR_INVALID_ARGUMENT
	rcNotSupported  rc = C.NVML_ERROR_NOT_SUPPORTED
	rcNotFound      rc = C.NVML_ERROR_NOT_FOUND
	rcSize          rc = C.NVML_ERROR_INSUFFICIENT_SIZE
	rcTimeout       rc = C.NVML_ERROR_TIMEOUT
	rcLost          rc = C.NVML_ERROR_GPU_IS_LOST
	rcInUse         rc = C.NVML_ERROR_IN_USE
	rcResources     rc = C.NVML_ERROR_INSUFFICIENT_RESOURCES
	rcVersion       rc = C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
	rcOS            rc = C.NVML_ERROR_OPERATING_SYSTEM
	rcResetRequired rc = C.NVML_ERROR_RESET_REQUIRED
	rcUnknown       rc = C.NVML_ERROR_UNKNOWN
)

var (
	mu        sync.Mutex // one call at a time, as NVML serialises its own API lock
	initCount int
	cur       *loaded
	handles   = map[uintptr]*handle{}
	byKey     = map[string]*handle{}
)

type hkind int

const (
	hDevice hkind = iota + 1
	hMig
	hGI
	hCI
	hSet
)

type handle struct {
	kind   hkind
	gpu    int // configured index
	gi, ci uint32
	set    *eventSet
	ptr    unsafe.Pointer
}

// issue hands out the handle of one entity; the same entity keeps the same handle in a process.
// Handles are C memory, as NVML's are pointers into its own memory: never Go pointers.
func issue(kind hkind, gpu int, gi, ci uint32) unsafe.Pointer {
	key := fmt.Sprintf("%d/%d/%d/%d", kind, gpu, gi, ci)
	if h, ok := byKey[key]; ok {
		return h.ptr
	}
	p := C.calloc(1, 64)
	h := &handle{kind: kind, gpu: gpu, gi: gi, ci: ci, ptr: p}
	handles[uintptr(p)] = h
	byKey[key] = h
	return p
}

func lookup(p unsafe.Pointer) *handle { return handles[uintptr(p)] }

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nvml-double: "+format+"\n", args...)
}

func doInit() rc {
	l, err := loadConfig()
	if err != nil {
		fail("%v", err)
		return rcUnknown
	}
	if err := seed(l); err != nil {
		fail("%v", err)
		return rcUnknown
	}
	if l.cfg.ResetAtInit && initCount == 0 {
		if err := resetGPUs(l); err != nil {
			fail("%v", err)
			return rcUnknown
		}
	}
	cur = l
	initCount++
	return rcOK
}

// resetGPUs is a GPU reset (or a reboot) between two processes: a pending MIG mode becomes current
// ("the target mode following the next activation trigger", nvmlDeviceGetMigMode), and the GPU
// and compute instances, which do not survive a reset, are gone.
func resetGPUs(l *loaded) error {
	err := mutateState(l.cfg.StateFile, func(s *State) bool {
		changed := false
		for _, g := range l.all {
			st := s.GPUs[g.uuid]
			if st == nil || st.MigModePending == st.MigMode {
				continue
			}
			st.MigMode, st.GpuInstances = st.MigModePending, nil
			changed = true
		}
		return changed
	})
	if err != nil {
		return err
	}
	return syncProcFromState(l)
}

// enter starts every call but init: UNINITIALIZED before nvmlInit, and the configuration re-read
// when its file changed (a test marks a GPU lost while a process runs).
func enter() rc {
	if initCount == 0 || cur == nil {
		return rcUninit
	}
	if cur.path == "" {
		return rcOK
	}
	st, err := os.Stat(cur.path)
	if err != nil || (st.ModTime().UnixNano() == cur.mtimeNs && st.Size() == cur.size) {
		return rcOK
	}
	l, err := loadConfig()
	if err != nil {
		fail("%v (keeping the configuration read before)", err)
		cur.mtimeNs, cur.size = st.ModTime().UnixNano(), st.Size()
		return rcOK
	}
	if err := seed(l); err != nil {
		fail("%v", err)
		return rcUnknown
	}
	cur = l
	return rcOK
}

// enterArgs is enter, then INVALID_ARGUMENT when the call's arguments are invalid (a NULL out
// pointer: every function's doc lists it).
func enterArgs(invalid bool) rc {
	if r := enter(); r != rcOK {
		return r
	}
	if invalid {
		return rcInvalid
	}
	return rcOK
}

// seed gives every configured GPU its state the first time the state file meets it: MIG mode,
// and the MIG devices configured for static MIG. State already there is the driver's and stays.
func seed(l *loaded) error {
	err := mutateState(l.cfg.StateFile, func(s *State) bool {
		changed := false
		for _, g := range l.all {
			if s.GPUs[g.uuid] != nil {
				continue
			}
			st := &GPUState{}
			if g.o.MigMode != nil {
				st.MigMode = *g.o.MigMode
			}
			st.MigModePending = st.MigMode
			if g.o.MigModePending != nil {
				st.MigModePending = *g.o.MigModePending
			}
			s.GPUs[g.uuid] = st
			changed = true
			if len(g.o.MigDevices) > 0 && st.MigMode != 1 {
				fail("GPU %d: migDevices need migMode 1; none created", g.cfgIndex)
				continue
			}
			for _, m := range g.o.MigDevices {
				pl, _ := placementOf(g, m.GiProfileID, uint32(m.Start))
				gi, r := createGI(g, st, uint32(m.GiProfileID), &pl)
				if r != rcOK {
					fail("GPU %d: static GPU instance profile %d at %d: %s", g.cfgIndex, m.GiProfileID, m.Start, errorString(r))
					continue
				}
				cis := m.ComputeInstances
				if len(cis) == 0 {
					cis = []CIConfig{{CiProfileID: fullCIProfile(g, gi)}}
				}
				for _, c := range cis {
					var start *uint32
					if c.Start != nil {
						v := uint32(*c.Start)
						start = &v
					}
					if _, r := createCI(g, gi, uint32(c.CiProfileID), start); r != rcOK {
						fail("GPU %d: static compute instance profile %d in GI %d: %s", g.cfgIndex, c.CiProfileID, gi.ID, errorString(r))
					}
				}
			}
		}
		return changed
	})
	if err != nil {
		return err
	}
	return syncProcFromState(l)
}

// syncProcFromState brings procRoot up to date with what the state file holds now.
func syncProcFromState(l *loaded) error {
	s, err := readState(l.cfg.StateFile)
	if err != nil {
		return err
	}
	return syncProc(l, s)
}

func errorString(r rc) string { return C.GoString(C.nvmlErrorString(r)) }

// fullCIProfile is the compute instance profile that spans the whole GPU instance.
func fullCIProfile(g *gpu, gi *GIState) int {
	p := g.model.MIGProfiles.GpuInstanceProfiles[int(gi.ProfileID)]
	for id, ci := range g.model.MIGProfiles.ComputeInstanceProfiles[int(gi.ProfileID)] {
		if ci.SliceCount == p.SliceCount {
			return id
		}
	}
	return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
}

// profileRC maps the mock's answer to a profile query: NOT_SUPPORTED stays, any other failure is
// an invalid profile.
func profileRC(r nvml.Return) rc {
	switch r {
	case nvml.SUCCESS:
		return rcOK
	case nvml.ERROR_NOT_SUPPORTED:
		return rcNotSupported
	default:
		return rcInvalid
	}
}

func giProfile(g *gpu, id uint32) (nvml.GpuInstanceProfileInfo, rc) {
	// NVIDIA's mock answers profile queries from its per-model tables.
	info, r := g.mock.GetGpuInstanceProfileInfo(int(id))
	return info, profileRC(r)
}

func ciProfile(g *gpu, giProfileID, id, eng uint32) (nvml.ComputeInstanceProfileInfo, rc) {
	mgi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{ProfileId: giProfileID}, g.model.MIGProfiles)
	info, r := mgi.GetComputeInstanceProfileInfo(int(id), int(eng))
	return info, profileRC(r)
}

func ciPlacements(g *gpu, giProfileID, id uint32) []nvml.ComputeInstancePlacement {
	mgi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{ProfileId: giProfileID}, g.model.MIGProfiles)
	info := nvml.ComputeInstanceProfileInfo{Id: id}
	pl, r := mgi.GetComputeInstancePossiblePlacements(&info)
	if r == nvml.SUCCESS && len(pl) > 0 {
		return pl
	}
	// Some of the mock's models (A100, A30) list no compute instance placements. A GPU instance
	// always has some (nvmlGpuInstanceGetComputeInstancePossiblePlacements); the driver packs a
	// profile of n slices at multiples of n within the GPU instance's slices, as the MIG user
	// guide's "nvidia-smi mig -lcipp" listings show ("0:1 1:1 2:1" for 1c in a 3g instance).
	gp, ok := g.model.MIGProfiles.GpuInstanceProfiles[int(giProfileID)]
	cp, ok2 := g.model.MIGProfiles.ComputeInstanceProfiles[int(giProfileID)][int(id)]
	if !ok || !ok2 || cp.SliceCount == 0 {
		return nil
	}
	for start := uint32(0); start+cp.SliceCount <= gp.SliceCount; start += cp.SliceCount {
		pl = append(pl, nvml.ComputeInstancePlacement{Start: start, Size: cp.SliceCount})
	}
	return pl
}

func overlaps(aStart, aSize, bStart, bSize uint32) bool {
	return aStart < bStart+bSize && bStart < aStart+aSize
}

// giID numbers GPU instances by their node in the binary tree of the 8 memory slices
// (0 = whole GPU, 1-2 = halves, 3-6 = quarters, 7-14 = eighths), the IDs A100/H100 drivers hand
// out (a 7g instance is GI 0, a 1g at slice 6 is GI 13). NVML itself documents only that
// "GPU instance IDs are unique per device" (nvmlDeviceGetGpuInstanceId); outside the tree the
// lowest free ID is used.
func giID(st *GPUState, start, size uint32) (uint32, bool) {
	span := uint32(1)
	for span < size {
		span <<= 1
	}
	if start+span <= 8 && start%span == 0 {
		id := 8/span - 1 + start/span
		if st.gi(id) == nil {
			return id, true
		}
	}
	for id := uint32(0); id < capsGIsPerGPU; id++ {
		if st.gi(id) == nil {
			return id, true
		}
	}
	return 0, false
}

func createGI(g *gpu, st *GPUState, profileID uint32, want *nvml.GpuInstancePlacement) (*GIState, rc) {
	// nvmlDeviceCreateGpuInstance*: "NVML_ERROR_NOT_SUPPORTED If device doesn't have MIG mode enabled".
	if st.MigMode != 1 {
		return nil, rcNotSupported
	}
	// "NVML_ERROR_INVALID_ARGUMENT If device, profile, profileId, placement or gpuInstance are invalid".
	info, r := giProfile(g, profileID)
	if r != rcOK {
		return nil, rcInvalid
	}
	placements, _ := g.mock.GetGpuInstancePossiblePlacements(&info)
	used := 0
	for _, gi := range st.GpuInstances {
		if gi.ProfileID == profileID {
			used++
		}
	}
	free := func(p nvml.GpuInstancePlacement) bool {
		for _, gi := range st.GpuInstances {
			if overlaps(p.Start, p.Size, gi.Start, gi.Size) {
				return false
			}
		}
		return true
	}
	var chosen *nvml.GpuInstancePlacement
	if want != nil {
		for i := range placements {
			if placements[i].Start == want.Start && placements[i].Size == want.Size {
				chosen = &placements[i]
			}
		}
		if chosen == nil {
			return nil, rcInvalid
		}
		if !free(*chosen) {
			// "NVML_ERROR_INSUFFICIENT_RESOURCES If the requested GPU instance could not be created".
			return nil, rcResources
		}
	} else {
		for i := range placements {
			if free(placements[i]) {
				chosen = &placements[i]
				break
			}
		}
	}
	if chosen == nil || used >= int(info.InstanceCount) {
		return nil, rcResources
	}
	id, ok := giID(st, chosen.Start, chosen.Size)
	if !ok {
		return nil, rcResources
	}
	gi := &GIState{ID: id, ProfileID: profileID, Start: chosen.Start, Size: chosen.Size}
	st.GpuInstances = append(st.GpuInstances, gi)
	return gi, rcOK
}

func createCI(g *gpu, gi *GIState, profileID uint32, start *uint32) (*CIState, rc) {
	info, r := ciProfile(g, gi.ProfileID, profileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if r != rcOK {
		return nil, rcInvalid
	}
	if len(gi.ComputeInstances) >= capsCIsPerGI {
		return nil, rcResources
	}
	used := 0
	for _, ci := range gi.ComputeInstances {
		if ci.ProfileID == profileID {
			used++
		}
	}
	var chosen *nvml.ComputeInstancePlacement
	placements := ciPlacements(g, gi.ProfileID, profileID)
	for i := range placements {
		p := placements[i]
		if start != nil && p.Start != *start {
			continue
		}
		busy := false
		for _, ci := range gi.ComputeInstances {
			if overlaps(p.Start, p.Size, ci.Start, ci.Size) {
				busy = true
			}
		}
		if !busy {
			chosen = &placements[i]
			break
		}
	}
	if start != nil && chosen == nil {
		valid := false
		for _, p := range placements {
			valid = valid || p.Start == *start
		}
		if !valid {
			return nil, rcInvalid
		}
	}
	if chosen == nil || used >= int(info.InstanceCount) {
		return nil, rcResources
	}
	id := uint32(0)
	for gi.ci(id) != nil {
		id++
	}
	ci := &CIState{ID: id, ProfileID: profileID, Start: chosen.Start, Size: chosen.Size}
	gi.ComputeInstances = append(gi.ComputeInstances, ci)
	return ci, rcOK
}

// migIndex is where a MIG device (one compute instance) sits among its parent's MIG device
// handles: its GPU instance's first slice plus its compute instance's first slice. Free slices
// leave holes, as nvmlDeviceGetMigDeviceHandleByIndex documents ("NVML_ERROR_NOT_FOUND if no
// valid MIG device was found at index").
func migIndex(gi *GIState, ci *CIState) uint32 { return gi.Start + ci.Start }

func maxMigDevices(g *gpu) uint32 {
	// One MIG device per compute slice at most: the 1-slice profile's instance count.
	if p, ok := g.model.MIGProfiles.GpuInstanceProfiles[nvml.GPU_INSTANCE_PROFILE_1_SLICE]; ok {
		return p.InstanceCount
	}
	return 0
}

// --- resolving handles ---------------------------------------------------------------------------

type ref struct {
	h   *handle
	g   *gpu
	s   *State
	st  *GPUState
	gi  *GIState
	ci  *CIState
	mig bool
}

func gpuOf(h *handle) *gpu {
	if h == nil || h.gpu < 0 || h.gpu >= len(cur.all) {
		return nil
	}
	return cur.all[h.gpu]
}

// resolve checks a handle: INVALID_ARGUMENT for one the library never issued or whose instance is
// gone, GPU_IS_LOST for every call on a GPU configured lost ("NVML_ERROR_GPU_IS_LOST if the target
// GPU has fallen off the bus or is otherwise inaccessible", on every per-device function).
func resolve(p unsafe.Pointer, kinds ...hkind) (*ref, rc) {
	if r := enter(); r != rcOK {
		return nil, r
	}
	h := lookup(p)
	if h == nil {
		return nil, rcInvalid
	}
	okKind := false
	for _, k := range kinds {
		okKind = okKind || h.kind == k
	}
	g := gpuOf(h)
	if !okKind || g == nil || !visible(g) {
		return nil, rcInvalid
	}
	if g.o.Lost {
		return nil, rcLost
	}
	s, err := readState(cur.cfg.StateFile)
	if err != nil {
		fail("%v", err)
		return nil, rcUnknown
	}
	r := &ref{h: h, g: g, s: s, st: s.GPUs[g.uuid], mig: h.kind == hMig}
	if r.st == nil {
		return nil, rcUnknown
	}
	if h.kind == hMig || h.kind == hGI || h.kind == hCI {
		r.gi = r.st.gi(h.gi)
		if r.gi == nil || r.st.MigMode != 1 {
			return nil, rcInvalid // the instance was destroyed: its handle is no longer valid
		}
		if h.kind != hGI {
			r.ci = r.gi.ci(h.ci)
			if r.ci == nil {
				return nil, rcInvalid
			}
		}
	}
	return r, rcOK
}

// resolveArgs is resolve, then INVALID_ARGUMENT when the call's arguments are invalid: a handle's
// errors come first, as in NVML.
func resolveArgs(p unsafe.Pointer, invalid bool, kinds ...hkind) (*ref, rc) {
	r, e := resolve(p, kinds...)
	if e != rcOK {
		return nil, e
	}
	if invalid {
		return nil, rcInvalid
	}
	return r, rcOK
}

// get is the whole of a call that reads one value of a handle: the handle resolved, INVALID_ARGUMENT
// for a NULL out pointer, the value written through it.
func get[T any](p unsafe.Pointer, out *T, value func(r *ref) T, kinds ...hkind) rc {
	defer locked()()
	r, e := resolveArgs(p, out == nil, kinds...)
	if e != rcOK {
		return e
	}
	*out = value(r)
	return rcOK
}

func visible(g *gpu) bool {
	for _, v := range cur.visible {
		if v == g {
			return true
		}
	}
	return false
}

// mutate re-reads the state under its exclusive lock, re-resolves the GPU in it, runs fn and
// writes the state back, then brings procRoot up to date.
func mutate(r *ref, fn func(st *GPUState) rc) rc {
	result := rcOK
	err := mutateState(cur.cfg.StateFile, func(s *State) bool {
		st := s.GPUs[r.g.uuid]
		if st == nil {
			result = rcUnknown
			return false
		}
		result = fn(st)
		return result == rcOK
	})
	if err != nil {
		fail("%v", err)
		return rcUnknown
	}
	if result == rcOK {
		if s, err := readState(cur.cfg.StateFile); err == nil {
			if err := syncProc(cur, s); err != nil {
				fail("procRoot: %v", err)
			}
		}
	}
	return result
}

// limitsSupported: whether the GPU answers the per-cgroup memory limit calls. Drivers before the
// calls existed, and GPUs the driver does not offer them on, answer NVML_ERROR_NOT_SUPPORTED; the
// configuration says which (`memoryLimits: false`), as no driver version that first has them is
// documented in nvml.h.
func limitsSupported(g *gpu) bool {
	return g.o.MemoryLimits == nil || *g.o.MemoryLimits
}

// recordLimitCall runs one nvmlDeviceSetMemoryLimits_v1 under the state's exclusive lock and
// appends the call and its answer to the GPU's memoryLimitCalls, whatever it answered.
func recordLimitCall(r *ref, cgroup string, soft, hard uint64, fn func(st *GPUState) rc) rc {
	result := rcOK
	err := mutateState(cur.cfg.StateFile, func(s *State) bool {
		st := s.GPUs[r.g.uuid]
		if st == nil {
			result = rcUnknown
			return false
		}
		result = fn(st)
		st.MemoryLimitCalls = append(st.MemoryLimitCalls, MemoryLimitCall{Cgroup: cgroup, Soft: soft, Hard: hard, Result: int(result)})
		return true
	})
	if err != nil {
		fail("%v", err)
		return rcUnknown
	}
	return result
}
