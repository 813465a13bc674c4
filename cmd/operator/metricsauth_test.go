package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
)

// stubReviewer stands in for the API server's TokenReview and SubjectAccessReview, so the
// filter's decisions and its caching can be checked call by call. (The filter against a real
// API server is checked end to end: test/e2e/metrics_test.go, 401, 403 and 200.)
type stubReviewer struct {
	users     map[string]string // token -> user name
	allowed   map[string]bool   // user name -> may get /metrics
	fail      error
	authnCall int
	authzCall int
}

func (s *stubReviewer) Authenticate(_ context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	s.authnCall++
	if s.fail != nil {
		return authenticationv1.UserInfo{}, false, s.fail
	}
	name, ok := s.users[token]
	return authenticationv1.UserInfo{Username: name}, ok, nil
}

func (s *stubReviewer) Authorize(_ context.Context, user authenticationv1.UserInfo, verb, path string) (bool, error) {
	s.authzCall++
	return s.allowed[user.Username] && verb == "get" && path == "/metrics", nil
}

func TestMetricsAuth(t *testing.T) {
	r := &stubReviewer{
		users:   map[string]string{"good": "system:serviceaccount:mon:prometheus", "unbound": "system:serviceaccount:mon:other"},
		allowed: map[string]bool{"system:serviceaccount:mon:prometheus": true},
	}
	now := time.Unix(1000, 0)
	auth := newMetricsAuth(r, func() time.Time { return now })
	h, err := auth.filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "metrics") }))
	if err != nil {
		t.Fatal(err)
	}
	get := func(method, path, header string) (int, string) {
		req := httptest.NewRequest(method, path, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct {
		name, method, path, header string
		code                       int
		authn, authz               int // reviews asked so far
	}{
		{"no header", "GET", "/metrics", "", 401, 0, 0},
		{"not bearer", "GET", "/metrics", "Basic Z29vZDp4", 401, 0, 0},
		{"empty token", "GET", "/metrics", "Bearer  ", 401, 0, 0},
		{"unknown token", "GET", "/metrics", "Bearer bad", 401, 1, 0},
		{"unknown token, cached", "GET", "/metrics", "Bearer bad", 401, 1, 0},
		{"unbound user", "GET", "/metrics", "Bearer unbound", 403, 2, 1},
		{"bound user", "GET", "/metrics", "Bearer good", 200, 3, 2},
		{"bound user, scheme in lower case, cached", "GET", "/metrics", "bearer good", 200, 3, 2},
		{"bound user, another path", "GET", "/debug", "Bearer good", 403, 3, 3},
		{"bound user, another verb", "POST", "/metrics", "Bearer good", 403, 3, 4},
	} {
		code, body := get(tc.method, tc.path, tc.header)
		if code != tc.code || r.authnCall != tc.authn || r.authzCall != tc.authz {
			t.Errorf("%s: code %d (%q), reviews %d/%d; want %d, %d/%d", tc.name, code, body, r.authnCall, r.authzCall, tc.code, tc.authn, tc.authz)
		}
		if code == 200 && body != "metrics" {
			t.Errorf("%s: body %q", tc.name, body)
		}
	}

	// A denial is cached for 30 s, an allowed user for a minute (its token) and 5 minutes.
	now = now.Add(31 * time.Second)
	if code, _ := get("GET", "/metrics", "Bearer unbound"); code != 403 || r.authnCall != 3 || r.authzCall != 5 {
		t.Errorf("denial after 31 s: code %d, reviews %d/%d; want 403, 3/5", code, r.authnCall, r.authzCall)
	}
	now = now.Add(30 * time.Second)
	if code, _ := get("GET", "/metrics", "Bearer good"); code != 200 || r.authnCall != 4 || r.authzCall != 5 {
		t.Errorf("token after 61 s: code %d, reviews %d/%d; want 200, 4/5 (token reviewed again, decision cached)", code, r.authnCall, r.authzCall)
	}

	// The API server cannot answer: 500, nothing cached.
	r.fail = errors.New("connection refused")
	if code, _ := get("GET", "/metrics", "Bearer other"); code != 500 {
		t.Errorf("review failed: code %d, want 500", code)
	}
	r.fail = nil
	r.users["other"] = "system:serviceaccount:mon:prometheus"
	if code, _ := get("GET", "/metrics", "Bearer other"); code != 200 {
		t.Errorf("after the API server recovered: code %d, want 200", code)
	}
}

// TestMetricsAuthBounded: distinct tokens never grow the caches past authCacheMax.
func TestMetricsAuthBounded(t *testing.T) {
	r := &stubReviewer{users: map[string]string{}, allowed: map[string]bool{}}
	for i := range 3 * authCacheMax {
		r.users[fmt.Sprint("t", i)] = fmt.Sprint("u", i)
	}
	auth := newMetricsAuth(r, time.Now)
	h, _ := auth.filter(logr.Discard(), http.NotFoundHandler())
	for i := range 3 * authCacheMax {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", fmt.Sprint("Bearer t", i))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 403 {
			t.Fatalf("token %d: code %d, want 403", i, rec.Code)
		}
		if auth.users.len() > authCacheMax || auth.decisions.len() > authCacheMax {
			t.Fatalf("after %d tokens: %d users, %d decisions cached; want at most %d", i+1, auth.users.len(), auth.decisions.len(), authCacheMax)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for in, want := range map[string]string{"Bearer abc": "abc", "bearer abc": "abc", "  Bearer   abc  ": "abc", "Bearer": "", "Bearer ": "", "Token abc": "", "": ""} {
		got, ok := bearerToken(in)
		if got != want || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
