// allocpeer: upstream's structured allocator
// (k8s.io/dynamic-resource-allocation/structured), called the way
// kube-scheduler's DynamicResources plugin calls it at v1.37.2: one
// NewAllocator per pod (PreFilter) over the allocated-device state, then one
// Allocate per node (Filter), then the chosen allocation's devices join the
// state (Reserve). Decisions only: no API writes.
//
// Job: {"classes": [DeviceClass], "slices": [ResourceSlice], "nodes": [name],
// "claims": [ResourceClaim], "feasible": K}. Node order, as the scheduler:
// rotating from the node after the last one chosen, Filter until K feasible
// nodes are found (or every node was tried), the first feasible one wins (all
// nodes score alike here). The same policy runs on our side.
package main

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"draplugin.local/tests/cluster/peers/internal/peerio"
)

type job struct {
	Classes  []*resourceapi.DeviceClass   `json:"classes"`
	Slices   []*resourceapi.ResourceSlice `json:"slices"`
	Nodes    []string                     `json:"nodes"`
	Claims   []*resourceapi.ResourceClaim `json:"claims"`
	Feasible int                          `json:"feasible"`
}

type placed struct {
	Node    string   `json:"node"`
	Devices []string `json:"devices"`
	Error   string   `json:"error,omitempty"`
}

type result struct {
	Seconds     float64  `json:"seconds"`
	FilterCalls int      `json:"filter_calls"`
	Claims      []placed `json:"claims"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, dc := range c {
		out = append(out, dc)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, errors.New("device class " + name + " not found")
}

// kube-scheduler 1.37's default feature gates, as AllocatorFeatures maps them.
var features = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
}

func main() {
	var j job
	peerio.ReadJob(&j)
	lister := classes{}
	for _, dc := range j.Classes {
		lister[dc.Name] = dc
	}
	nodes := make([]*v1.Node, len(j.Nodes))
	for i, name := range j.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	feasibleWanted := j.Feasible
	if feasibleWanted <= 0 || feasibleWanted > len(nodes) {
		feasibleWanted = len(nodes)
	}
	ctx := context.Background()
	// As the plugin: one LRU of compiled expressions for the scheduler's life.
	celCache := dracel.NewCache(10, dracel.Features{EnableConsumableCapacity: true})
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	res := result{Claims: make([]placed, len(j.Claims))}
	next := 0

	start := time.Now()
	for ci, claim := range j.Claims {
		allocator, err := structured.NewAllocator(ctx, features, state, lister, j.Slices, celCache)
		if err != nil {
			peerio.Fail("new allocator: %v", err)
		}
		var chosen *resourceapi.AllocationResult
		chosenAt, feasible := -1, 0
		for i := 0; i < len(nodes) && feasible < feasibleWanted; i++ {
			at := (next + i) % len(nodes)
			res.FilterCalls++
			results, err := allocator.Allocate(ctx, nodes[at], []*resourceapi.ResourceClaim{claim})
			if err != nil {
				// A Filter error fails the pod's scheduling attempt.
				res.Claims[ci].Error = err.Error()
				chosen = nil
				break
			}
			if len(results) == 0 {
				continue
			}
			feasible++
			if chosen == nil {
				chosen, chosenAt = &results[0], at
			}
		}
		if chosen == nil {
			continue
		}
		next = (chosenAt + 1) % len(nodes)
		res.Claims[ci].Node = j.Nodes[chosenAt]
		for _, r := range chosen.Devices.Results {
			state.AllocatedDevices.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
			res.Claims[ci].Devices = append(res.Claims[ci].Devices, r.Driver+"/"+r.Pool+"/"+r.Device)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	peerio.Write(res)
}
