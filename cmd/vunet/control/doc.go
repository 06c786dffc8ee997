// Package control is vunet's control endpoint and its client: JSON over
// HTTP on a UNIX socket (--control PATH, off by default), whose file
// permissions decide who may use it. It lists, adds and removes forwarded
// TCP and UDP ports while the daemon runs (what passt's control socket and
// gvproxy's expose/unexpose do) and reports a read-only status: the
// guest's addresses, its flows by protocol, the queue pairs.
//
// The API, version 1:
//
//	GET    /v1/forwards             the forwarded ports open
//	POST   /v1/forwards             {"protocol":"tcp","spec":"8080:80"}: add
//	DELETE /v1/forwards             {"protocol":"tcp","spec":"8080"}: remove by host port
//	DELETE /v1/forwards/{id}        remove one by its ID
//	GET    /v1/status               guest, flows, queues, forwards
//
// A spec is passt's -t/-u syntax with explicit ports ("22", "8000-8010",
// "2222:22", "127.0.0.1/8080", "%eth0/8080", "8000-8010,~8005"); "all",
// "none", "auto" and exclusion-only specs belong on the command line.
// Errors come back as {"error": "..."} with a status that says why: 400 a
// bad request, 403 a port the daemon may not bind (privileges dropped),
// 404 no such forward, 409 an overlap or a port in use, 503 out of
// descriptors or shutting down.
//
// Changes reach the data plane through tcpstack.Stack's AddForwards and
// RemoveForwards, which hand them to queue pair 0's event loop: nothing on
// the data path takes a lock for them.
package control
