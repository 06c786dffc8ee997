// Package vhostuser is vunet's control plane: it speaks the vhost-user
// protocol with a front-end (QEMU, DPDK virtio-user, cloud-hypervisor) over a
// UNIX socket, receives the guest's memory and virtqueues as file
// descriptors, and drives a virtqueue.DataPlane that moves the frames.
//
// The package owns the message codec (header, payloads, SCM_RIGHTS file
// descriptors), the device state machine (features, protocol features,
// memory table, vring lifecycle) and the socket plumbing (listening server,
// reconnecting client, a single pre-connected socket).
//
// Of vunet's own packages it imports only virtqueue. It must not import
// tcpstack, metrics or cmd: the data plane is driven through the
// virtqueue.DataPlane interface (declared in virtqueue, which both sides
// import, so no adapter sits between them), and metrics read its Stats.
package vhostuser
