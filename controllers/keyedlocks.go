package controllers

import "sync"

// keyedLocks is a lock per key, for keys that come and go (sharing keys, namespaces): a key's
// lock lives while someone holds or waits for it, so that a map of every key ever locked does
// not only grow. The zero value is ready.
type keyedLocks struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

// keyedLock is one key's lock and how many hold or wait for it (guarded by keyedLocks.mu).
type keyedLock struct {
	sync.Mutex
	users int
}

// lock locks key and returns the unlock.
func (k *keyedLocks) lock(key string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
