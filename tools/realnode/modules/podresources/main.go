// podresources-client asks a pod-resources socket (the kubelet's, or
// dpproxy's --pod_resources_socket) what a monitoring agent asks, through
// the client Kubernetes generates for the API (k8s.io/kubelet), and prints
// the answer as JSON:
//
//	podresources-client --socket=PATH list|allocatable
//
// The real-node tier (tests/realnode/e2e.py) reads dpproxy's view with it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	socket := flag.String("socket", "", "the pod-resources socket (a Unix socket path)")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of the call")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s --socket=PATH list|allocatable\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if *socket == "" || flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	conn, err := grpc.NewClient("unix://"+*socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
		}))
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources-client: %s: %v\n", *socket, err)
		os.Exit(1)
	}
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var answer any
	switch flag.Arg(0) {
	case "list":
		answer, err = client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	case "allocatable":
		answer, err = client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources-client: %s %s: %v\n", *socket, flag.Arg(0), err)
		os.Exit(1)
	}
	out, err := json.Marshal(answer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "podresources-client: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}
