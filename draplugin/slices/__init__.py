"""Publishing this node's devices as ResourceSlices.

`plan` cuts the devices into slices within API limits and `render` turns them
into ResourceSlice objects (both pure); `compare` tells a stored slice from
the one we would write; `api` is the few API calls made, on the shared
client; `publisher` is the loop that syncs, watches and retries; `metrics`
its counters.
"""
