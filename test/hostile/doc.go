// Package hostile holds tests only: it starts vunet's vhost-user server in
// process and attacks it with malformed vhost-user messages and malicious
// descriptor chains through test/frontend, then checks that the server is
// still alive, counted what it rejected, and serves a new front-end normally.
//
// It may import any vunet package; nothing may import it.
package hostile
