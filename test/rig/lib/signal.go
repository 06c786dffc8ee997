package rig

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// live holds every rig not yet closed, so SIGINT/SIGTERM (Ctrl-C during go
// test, which would otherwise kill the process before any t.Cleanup runs)
// can tear them all down before the process dies.
var live struct {
	sync.Mutex
	rigs    map[*Rig]struct{}
	handler bool
}

func register(r *Rig) {
	live.Lock()
	defer live.Unlock()
	if live.rigs == nil {
		live.rigs = map[*Rig]struct{}{}
	}
	live.rigs[r] = struct{}{}
	if !live.handler {
		live.handler = true
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		go onSignal(ch)
	}
}

func unregister(r *Rig) {
	live.Lock()
	defer live.Unlock()
	delete(live.rigs, r)
}

// onSignal closes every live rig, then re-raises the signal with the
// default action so the process ends the way it would have.
func onSignal(ch chan os.Signal) {
	sig := <-ch
	live.Lock()
	rigs := make([]*Rig, 0, len(live.rigs))
	for r := range live.rigs {
		rigs = append(rigs, r)
	}
	live.Unlock()
	var wg sync.WaitGroup
	for _, r := range rigs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Close()
		}()
	}
	wg.Wait()
	Cleanup()
	signal.Reset()
	if s, ok := sig.(syscall.Signal); ok {
		syscall.Kill(os.Getpid(), s)
		time.Sleep(time.Second) // the default action ends the process here
	}
	os.Exit(1)
}
