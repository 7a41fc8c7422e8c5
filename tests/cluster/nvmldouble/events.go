package main

// Events: the test appends JSON lines to the configured eventsFile; nvmlEventSetWait_v2 delivers
// them in order to every event set whose registration covers the line's GPU and type. Each event
// set keeps its own read offset, so each set sees every event once.

/*
#include <stdlib.h>
#include "nvml.h"
*/
import "C"

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"time"
	"unsafe"
)

type eventSet struct {
	regs   map[int]uint64 // configured GPU index -> registered event types
	offset int64
}

type eventLine struct {
	GPU               int     `json:"gpu"`
	Type              string  `json:"type"`
	Data              uint64  `json:"data"`
	GpuInstanceID     *uint32 `json:"gpuInstanceId"`
	ComputeInstanceID *uint32 `json:"computeInstanceId"`
}

var eventTypes = map[string]uint64{
	"xid":             C.nvmlEventTypeXidCriticalError,
	"doubleBitEcc":    C.nvmlEventTypeDoubleBitEccError,
	"singleBitEcc":    C.nvmlEventTypeSingleBitEccError,
	"migConfigChange": C.nvmlEventMigConfigChange,
	"gpuUnavailable":  C.nvmlEventTypeGpuUnavailableError,
	"recovery":        C.nvmlEventTypeGpuRecoveryAction,
}

// instanceIDs are the GPU and compute instance ids of an event or a process: the configured ones,
// "set to 0xFFFFFFFF otherwise" (nvmlEventData_t; nvmlProcessInfo_t the same).
func instanceIDs(gi, ci *uint32) (uint32, uint32) {
	g, c := uint32(0xFFFFFFFF), uint32(0xFFFFFFFF)
	if gi != nil {
		g = *gi
	}
	if ci != nil {
		c = *ci
	}
	return g, c
}

func supportedEvents(g *gpu) uint64 {
	var all uint64
	for name, t := range eventTypes {
		if name == "migConfigChange" && len(g.model.MIGProfiles.GpuInstanceProfiles) == 0 {
			continue
		}
		all |= t
	}
	return all
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *C.nvmlEventSet_t) C.nvmlReturn_t {
	defer locked()()
	if r := enterArgs(set == nil); r != rcOK {
		return r
	}
	p := C.calloc(1, 64)
	handles[uintptr(p)] = &handle{kind: hSet, ptr: p, set: &eventSet{regs: map[int]uint64{}}}
	*set = setH(p)
	return rcOK
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	defer locked()()
	if r := enter(); r != rcOK {
		return r
	}
	h := lookup(unsafe.Pointer(set.handle))
	if h == nil || h.kind != hSet {
		return rcInvalid
	}
	delete(handles, uintptr(h.ptr))
	C.free(h.ptr)
	return rcOK
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(device C.nvmlDevice_t, eventTypes *C.ulonglong) C.nvmlReturn_t {
	return get(unsafe.Pointer(device.handle), eventTypes, func(r *ref) C.ulonglong { return C.ulonglong(supportedEvents(r.g)) }, hDevice)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(device C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	defer locked()()
	r, e := resolve(unsafe.Pointer(device.handle), hDevice)
	if e != rcOK {
		return e
	}
	h := lookup(unsafe.Pointer(set.handle))
	if h == nil || h.kind != hSet {
		return rcInvalid
	}
	// "NVML_ERROR_NOT_SUPPORTED if the platform does not support this feature or some of
	// requested event types".
	if uint64(types)&^supportedEvents(r.g) != 0 {
		return rcNotSupported
	}
	h.set.regs[r.g.cfgIndex] |= uint64(types)
	return rcOK
}

// nextEvent reads the events file from the set's offset; complete lines only.
func nextEvent(es *eventSet) (*eventLine, bool) {
	if cur.cfg.EventsFile == "" {
		return nil, false
	}
	f, err := os.Open(cur.cfg.EventsFile)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if _, err := f.Seek(es.offset, io.SeekStart); err != nil {
		return nil, false
	}
	rd := bufio.NewReader(f)
	for {
		line, err := rd.ReadBytes('\n')
		if err != nil {
			return nil, false // EOF or a line still being written
		}
		es.offset += int64(len(line))
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev eventLine
		if err := json.Unmarshal(line, &ev); err != nil {
			fail("%s: skipping event %q: %v", cur.cfg.EventsFile, line, err)
			continue
		}
		t, ok := eventTypes[ev.Type]
		if !ok {
			fail("%s: skipping event of unknown type %q", cur.cfg.EventsFile, ev.Type)
			continue
		}
		if es.regs[ev.GPU]&t != 0 {
			return &ev, true
		}
	}
}

func waitEvent(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutms C.uint) C.nvmlReturn_t {
	deadline := time.Now().Add(time.Duration(timeoutms) * time.Millisecond)
	for {
		mu.Lock()
		if r := enter(); r != rcOK {
			mu.Unlock()
			return r
		}
		h := lookup(unsafe.Pointer(set.handle))
		// "NVML_ERROR_INVALID_ARGUMENT if set or data is NULL".
		if h == nil || h.kind != hSet || data == nil {
			mu.Unlock()
			return rcInvalid
		}
		if ev, ok := nextEvent(h.set); ok {
			gi, ci := instanceIDs(ev.GpuInstanceID, ev.ComputeInstanceID)
			*data = C.nvmlEventData_t{
				device:    devH(issue(hDevice, ev.GPU, 0, 0)),
				eventType: C.ulonglong(eventTypes[ev.Type]), eventData: C.ulonglong(ev.Data),
				gpuInstanceId: C.uint(gi), computeInstanceId: C.uint(ci),
			}
			mu.Unlock()
			return rcOK
		}
		mu.Unlock()
		if !time.Now().Before(deadline) {
			return rcTimeout
		}
		time.Sleep(20 * time.Millisecond)
	}
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutms C.uint) C.nvmlReturn_t {
	return waitEvent(set, data, timeoutms)
}

//export nvmlEventSetWait
func nvmlEventSetWait(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutms C.uint) C.nvmlReturn_t {
	return waitEvent(set, data, timeoutms)
}
