package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// apiClient is what the lb pod reads and writes in the API: Services (its own, or the members of a
// shared address), its ServiceAccount (the member namespaces) and its Lease. It stands for
// client-go's clientset, whose scheme registers every API group when the program starts: some 55
// packages of k8s.io/api, a third of the binary, mapped by every lb pod (TestNoClientset keeps them
// out).
// Each method is the clientset's (k8s.io/client-go/gentype), requests and errors alike.
type apiClient interface {
	Services(namespace string) objectClient[*corev1.Service, *corev1.ServiceList]
	ServiceAccounts(namespace string) objectClient[*corev1.ServiceAccount, *corev1.ServiceAccountList]
	Leases(namespace string) objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList]
}

// objectClient reads and writes the objects of one resource in one namespace, as the clientset's
// typed clients do. The lb pod's RBAC decides which of these it may call.
type objectClient[T runtime.Object, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// newAPIClient is the clientset's NewForConfig for the two API groups the lb pod uses: one HTTP
// client (transport, connections) shared by both, a rate limiter per group unless cfg sets QPS
// (then one for both), and the default user agent when cfg has none.
func newAPIClient(cfg *rest.Config) (apiClient, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	scheme := apiScheme()
	params := runtime.NewParameterCodec(scheme)
	codecs := rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	core, err := groupClient(c, corev1.SchemeGroupVersion, "/api", codecs, httpClient)
	if err != nil {
		return nil, err
	}
	coordination, err := groupClient(c, coordinationv1.SchemeGroupVersion, "/apis", codecs, httpClient)
	if err != nil {
		return nil, err
	}
	return &restAPIClient{core: core, coordination: coordination, params: params}, nil
}

// apiScheme knows the lb pod's kinds and, as the clientset's scheme, the options and Status of
// meta/v1 in each of their group versions (query parameters, errors, watch events).
func apiScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	s.AddKnownTypes(corev1.SchemeGroupVersion, &corev1.Service{}, &corev1.ServiceList{}, &corev1.ServiceAccount{}, &corev1.ServiceAccountList{})
	metav1.AddToGroupVersion(s, corev1.SchemeGroupVersion)
	s.AddKnownTypes(coordinationv1.SchemeGroupVersion, &coordinationv1.Lease{}, &coordinationv1.LeaseList{})
	metav1.AddToGroupVersion(s, coordinationv1.SchemeGroupVersion)
	return s
}

// groupClient is the REST client of one group version, as the clientset's group clients make it
// (setConfigDefaults).
func groupClient(c rest.Config, gv schema.GroupVersion, apiPath string, codecs runtime.NegotiatedSerializer, httpClient *http.Client) (*rest.RESTClient, error) {
	c.GroupVersion, c.APIPath, c.NegotiatedSerializer = &gv, apiPath, codecs
	return rest.RESTClientForConfigAndClient(&c, httpClient)
}

type restAPIClient struct {
	core, coordination *rest.RESTClient
	params             runtime.ParameterCodec
}

func (c *restAPIClient) Services(ns string) objectClient[*corev1.Service, *corev1.ServiceList] {
	return &restObjects[*corev1.Service, *corev1.ServiceList]{client: c.core, params: c.params, resource: "services", namespace: ns,
		newObject: func() *corev1.Service { return &corev1.Service{} }, newList: func() *corev1.ServiceList { return &corev1.ServiceList{} }}
}

func (c *restAPIClient) ServiceAccounts(ns string) objectClient[*corev1.ServiceAccount, *corev1.ServiceAccountList] {
	return &restObjects[*corev1.ServiceAccount, *corev1.ServiceAccountList]{client: c.core, params: c.params, resource: "serviceaccounts", namespace: ns,
		newObject: func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} }, newList: func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} }}
}

func (c *restAPIClient) Leases(ns string) objectClient[*coordinationv1.Lease, *coordinationv1.LeaseList] {
	return &restObjects[*coordinationv1.Lease, *coordinationv1.LeaseList]{client: c.coordination, params: c.params, resource: "leases", namespace: ns,
		newObject: func() *coordinationv1.Lease { return &coordinationv1.Lease{} }, newList: func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} }}
}

// restObjects is an objectClient: the requests of client-go's gentype.Client (which the generated
// typed clients are), for namespaced objects. Built-in kinds prefer protobuf, as there.
type restObjects[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object] struct {
	client              *rest.RESTClient
	params              runtime.ParameterCodec
	resource, namespace string
	newObject           func() T
	newList             func() L
}

func (c *restObjects[T, L]) request(r *rest.Request) *rest.Request {
	return r.UseProtobufAsDefault().NamespaceIfScoped(c.namespace, c.namespace != "").Resource(c.resource)
}

func (c *restObjects[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	result := c.newObject()
	err := c.request(c.client.Get()).Name(name).VersionedParams(&opts, c.params).Do(ctx).Into(result)
	return result, err
}

func (c *restObjects[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	result := c.newList()
	err := c.request(c.client.Get()).VersionedParams(&opts, c.params).Timeout(timeout(opts)).Do(ctx).Into(result)
	return result, err
}

func (c *restObjects[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(c.client.Get()).VersionedParams(&opts, c.params).Timeout(timeout(opts)).Watch(ctx)
}

func (c *restObjects[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	result := c.newObject()
	err := c.request(c.client.Post()).VersionedParams(&opts, c.params).Body(obj).Do(ctx).Into(result)
	return result, err
}

func (c *restObjects[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	result := c.newObject()
	err := c.request(c.client.Put()).Name(obj.GetName()).VersionedParams(&opts, c.params).Body(obj).Do(ctx).Into(result)
	return result, err
}

// timeout is a list's or watch's timeoutSeconds as the request's timeout (zero: none).
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
