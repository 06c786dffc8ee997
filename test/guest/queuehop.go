package guest

// Moving the guest's traffic between TX queues while checks run (a
// multiqueue guest whose sockets change TX queue, as when their thread
// moves to another vCPU).
const (
	// ParamQueueHop = "mode,period" makes the agent move its transmissions
	// to the next TX queue every period while the xfer, udpecho and ping
	// checks run. Mode QueueHopCPU pins the agent's threads to the next
	// vCPU (the kernel's XPS map, set by virtio-net when the guest has a
	// queue pair per vCPU, then picks that vCPU's queue for a socket once
	// nothing of it is in flight); mode QueueHopXPS points every vCPU's XPS
	// map at the next TX queue. Those checks then report hops (moves made),
	// hop_mode and hop_queues (the queues or vCPUs gone through).
	ParamQueueHop = "vunet.qhop"
	QueueHopCPU   = "cpu"
	QueueHopXPS   = "xps"
)
