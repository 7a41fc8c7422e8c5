// slicepeer: upstream's ResourceSlice controller
// (k8s.io/dynamic-resource-allocation/resourceslice, what kubeletplugin.Helper
// publishes through) publishing the benchmark's devices for one node against
// the same kube-apiserver as our publisher.
//
// Job: {"kubeconfig", "driver", "node", "slices": [[Device...]...] (the same
// devices, split the way ours splits them), "changed": {"slice", "index",
// "device"}, "resyncs", "idle_seconds"}.
// Phases, each timed from the trigger until the controller's worker has
// finished the pool (a Done on its work queue, observed through a wrapping
// queue): first publish (StartController: informer sync, node lookup,
// creates), one device changed (Update), resync with nothing changed (Update
// with the same resources), idle (no trigger, writes counted over the window).
// API writes are the controller's own counters (creates + updates + deletes).
// Client-side rate limiting is off, as in our Python client.
package main

import (
	"context"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"draplugin.local/tests/cluster/peers/internal/peerio"
)

type change struct {
	Slice  int                `json:"slice"`
	Index  int                `json:"index"`
	Device resourceapi.Device `json:"device"`
}

type job struct {
	Kubeconfig  string                 `json:"kubeconfig"`
	Driver      string                 `json:"driver"`
	Node        string                 `json:"node"`
	Slices      [][]resourceapi.Device `json:"slices"`
	Changed     change                 `json:"changed"`
	Resyncs     int                    `json:"resyncs"`
	IdleSeconds float64                `json:"idle_seconds"`
}

type phase struct {
	Seconds float64 `json:"seconds"`
	Writes  int64   `json:"writes"`
}

type result struct {
	First  phase `json:"first_publish"`
	Change phase `json:"change_one_device"`
	Resync phase `json:"resync_no_change"`
	Idle   phase `json:"idle"`
}

// doneQueue is the controller's default queue, plus a signal each time the
// worker finishes an item: the only outside view of "this sync is over" when a
// sync makes no API call.
type doneQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu    sync.Mutex
	cond  *sync.Cond
	dones int
}

func (q *doneQueue) Done(item string) {
	q.TypedRateLimitingInterface.Done(item)
	q.mu.Lock()
	q.dones++
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *doneQueue) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dones
}

// waitPast blocks until more than `seen` items are done and `ready` holds.
func (q *doneQueue) waitPast(seen int, ready func() bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.dones <= seen || !ready() {
		q.cond.Wait()
	}
}

func resources(j *job, slices [][]resourceapi.Device) *resourceslice.DriverResources {
	pool := resourceslice.Pool{}
	for _, devices := range slices {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: devices})
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{j.Node: pool}}
}

func main() {
	var j job
	peerio.ReadJob(&j)
	klog.SetOutput(nopWriter{})
	klog.LogToStderr(false)
	config, err := clientcmd.BuildConfigFromFlags("", j.Kubeconfig)
	if err != nil {
		peerio.Fail("kubeconfig: %v", err)
	}
	config.QPS, config.Burst = -1, 0 // no client-side rate limit (ours has none)
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		peerio.Fail("client: %v", err)
	}
	queue := &doneQueue{TypedRateLimitingInterface: workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "node_resource_slices"},
	)}
	queue.cond = sync.NewCond(&queue.mu)
	var ctrl *resourceslice.Controller
	writes := func() int64 {
		s := ctrl.GetStats()
		return s.NumCreates + s.NumUpdates + s.NumDeletes
	}
	ctx := context.Background()
	var res result

	start := time.Now()
	ctrl, err = resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: j.Driver,
		KubeClient: client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: j.Node},
		Resources:  resources(&j, j.Slices),
		Queue:      queue,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			peerio.Fail("%s: %v", msg, err)
		},
	})
	if err != nil {
		peerio.Fail("start controller: %v", err)
	}
	queue.waitPast(0, func() bool { return ctrl.GetStats().NumCreates >= int64(len(j.Slices)) })
	res.First = phase{time.Since(start).Seconds(), writes()}

	changed := make([][]resourceapi.Device, len(j.Slices))
	for i, s := range j.Slices {
		changed[i] = append([]resourceapi.Device(nil), s...)
	}
	changed[j.Changed.Slice][j.Changed.Index] = j.Changed.Device
	before, seen := writes(), queue.count()
	start = time.Now()
	ctrl.Update(resources(&j, changed))
	queue.waitPast(seen, func() bool { return true })
	res.Change = phase{time.Since(start).Seconds(), writes() - before}

	before = writes()
	for i := 0; i < j.Resyncs; i++ {
		seen = queue.count()
		start = time.Now()
		ctrl.Update(resources(&j, changed))
		queue.waitPast(seen, func() bool { return true })
		res.Resync.Seconds += time.Since(start).Seconds()
	}
	if j.Resyncs > 0 {
		res.Resync.Seconds /= float64(j.Resyncs)
	}
	res.Resync.Writes = writes() - before

	before = writes()
	time.Sleep(time.Duration(j.IdleSeconds * float64(time.Second)))
	res.Idle = phase{j.IdleSeconds, writes() - before}
	ctrl.Stop()
	peerio.Write(res)
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
