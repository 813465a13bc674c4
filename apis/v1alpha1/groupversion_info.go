// Package v1alpha1 holds the lbsvc.io/v1alpha1 API: the cluster-scoped Subnet that LoadBalancer
// Services draw their underlay addresses from, and the annotation keys the operator reads and writes.
//
// +kubebuilder:object:generate=true
// +groupName=lbsvc.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "lbsvc.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
