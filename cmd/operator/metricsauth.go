package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The metrics filter does what controller-runtime's filters.WithAuthenticationAndAuthorization
// does (a TokenReview for the bearer token, a SubjectAccessReview for the verb and path, results
// cached for the same times), with the two typed clients the operator links anyway. That filter
// builds on k8s.io/apiserver's delegating authenticator and authorizer, which bring along CEL,
// OpenTelemetry, gRPC and the API server's option and webhook packages: 20 MB of the
// operator's 54 MB of code, most of it paged in at start-up by package initialisers (43 MB of
// file-backed RSS in make bench-operator), for two API calls.

// Cache times, as controller-runtime's filter sets them.
const (
	tokenCacheTTL = time.Minute
	allowCacheTTL = 5 * time.Minute
	denyCacheTTL  = 30 * time.Second
	// authCacheMax bounds each cache: scrapers are few, and a flood of distinct bad tokens
	// must not grow the operator's memory.
	authCacheMax = 256
	// reviewTimeout bounds one review, so a slow API server cannot pile up scrapes.
	reviewTimeout = 10 * time.Second
)

// reviewer asks the API server who a token is and what that user may do.
type reviewer interface {
	// Authenticate returns the token's user, and false when the API server does not know it.
	Authenticate(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error)
	// Authorize tells whether the user may use verb on the non-resource path.
	Authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, error)
}

// apiReviewer is the reviewer backed by the API server's TokenReview and SubjectAccessReview.
type apiReviewer struct {
	authn authnclient.TokenReviewInterface
	authz authzclient.SubjectAccessReviewInterface
}

func (a apiReviewer) Authenticate(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	tr, err := a.authn.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("token review: %w", err)
	}
	return tr.Status.User, tr.Status.Authenticated, nil
}

func (a apiReviewer) Authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := a.authz.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Verb: verb, Path: path},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	return sar.Status.Allowed && !sar.Status.Denied, nil
}

// metricsAuthFilter is the metrics server's FilterProvider.
func metricsAuthFilter(c *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authnclient.NewForConfigAndClient(c, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authzclient.NewForConfigAndClient(c, httpClient)
	if err != nil {
		return nil, err
	}
	auth := newMetricsAuth(apiReviewer{authn: authn.TokenReviews(), authz: authz.SubjectAccessReviews()}, time.Now)
	return auth.filter, nil
}

// metricsAuth authenticates and authorizes each request to the metrics server, with bounded
// caches of the API server's answers.
type metricsAuth struct {
	r   reviewer
	now func() time.Time

	users     *ttlCache[[sha256.Size]byte, userEntry]
	decisions *ttlCache[decisionKey, bool]
}

// userEntry is a TokenReview's answer: the user, and whether the token is known.
type userEntry struct {
	user authenticationv1.UserInfo
	ok   bool
}

// decisionKey is a user (all of what the review is asked about) and the request.
type decisionKey struct {
	token      [sha256.Size]byte
	verb, path string
}

func newMetricsAuth(r reviewer, now func() time.Time) *metricsAuth {
	return &metricsAuth{r: r, now: now, users: newTTLCache[[sha256.Size]byte, userEntry](), decisions: newTTLCache[decisionKey, bool]()}
}

// filter wraps handler: 401 without a token the API server knows, 403 for a user not allowed
// to get the path, 500 when the API server could not answer.
func (m *metricsAuth) filter(log logr.Logger, handler http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), reviewTimeout)
		defer cancel()
		token, ok := bearerToken(req.Header.Get("Authorization"))
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		key := sha256.Sum256([]byte(token))
		user, ok, err := m.authenticate(ctx, key, token)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		allowed, err := m.authorize(ctx, decisionKey{token: key, verb: strings.ToLower(req.Method), path: req.URL.Path}, user)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			http.Error(w, fmt.Sprintf("Authorization denied for user %s", user.Username), http.StatusForbidden)
			return
		}
		handler.ServeHTTP(w, req)
	}), nil
}

// bearerToken takes the token out of an Authorization header ("Bearer <token>", the scheme in
// any case, as the API server accepts it).
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return "", false
	}
	return token, true
}

func (m *metricsAuth) authenticate(ctx context.Context, key [sha256.Size]byte, token string) (authenticationv1.UserInfo, bool, error) {
	now := m.now()
	if e, hit := m.users.get(key, now); hit {
		return e.user, e.ok, nil
	}
	user, ok, err := m.r.Authenticate(ctx, token)
	if err != nil {
		return user, false, err
	}
	m.users.put(key, userEntry{user: user, ok: ok}, now, tokenCacheTTL)
	return user, ok, nil
}

func (m *metricsAuth) authorize(ctx context.Context, key decisionKey, user authenticationv1.UserInfo) (bool, error) {
	now := m.now()
	if allowed, hit := m.decisions.get(key, now); hit {
		return allowed, nil
	}
	allowed, err := m.r.Authorize(ctx, user, key.verb, key.path)
	if err != nil {
		return false, err
	}
	ttl := denyCacheTTL
	if allowed {
		ttl = allowCacheTTL
	}
	m.decisions.put(key, allowed, now, ttl)
	return allowed, nil
}

// ttlCache holds answers until they expire, never more than authCacheMax of them: when full it
// drops the expired ones, and when all are still valid, all of them (a miss costs one review;
// unbounded growth costs memory).
type ttlCache[K comparable, V any] struct {
	mu      sync.Mutex
	entries map[K]ttlEntry[V]
}

type ttlEntry[V any] struct {
	value   V
	expires time.Time
}

func newTTLCache[K comparable, V any]() *ttlCache[K, V] {
	return &ttlCache[K, V]{entries: map[K]ttlEntry[V]{}}
}

func (c *ttlCache[K, V]) get(key K, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.value, true
}

func (c *ttlCache[K, V]) put(key K, value V, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= authCacheMax {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
	}
	if len(c.entries) >= authCacheMax {
		clear(c.entries)
	}
	c.entries[key] = ttlEntry[V]{value: value, expires: now.Add(ttl)}
}

func (c *ttlCache[K, V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
