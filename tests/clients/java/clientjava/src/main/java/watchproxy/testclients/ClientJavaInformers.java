package watchproxy.testclients;

import io.kubernetes.client.informer.ResourceEventHandler;
import io.kubernetes.client.informer.SharedIndexInformer;
import io.kubernetes.client.informer.SharedInformerFactory;
import io.kubernetes.client.openapi.ApiClient;
import io.kubernetes.client.openapi.models.V1ConfigMap;
import io.kubernetes.client.openapi.models.V1ConfigMapList;
import io.kubernetes.client.openapi.models.V1ObjectMeta;
import io.kubernetes.client.util.Config;
import io.kubernetes.client.util.generic.GenericKubernetesApi;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * The official client-java's {@code SharedInformerFactory} informers on the configmaps of one
 * namespace, every handler call as one JSON line (see {@link Lines}).
 *
 * <pre>
 *   java -jar client-java-informers.jar [--namespace NS] [--informers N]
 * </pre>
 *
 * The client is {@code Config.defaultClient()} (KUBECONFIG), with the read timeout turned off
 * as the library's informer example does (an informer's watch is quiet for minutes; OkHttp's
 * default 10 s read timeout would end it). A factory keeps one informer per object class, so
 * each of the N informers comes from a factory of its own: N independent components of one
 * application, each with its own LIST and watch, over one shared HTTP client. READY is printed
 * once every informer has synced.
 */
public final class ClientJavaInformers {
  private static final String USAGE =
      "java -jar client-java-informers.jar [--namespace NS] [--informers N]";
  private static final long SYNC_POLL_MILLIS = 10;

  private ClientJavaInformers() {}

  public static void main(String[] args) throws IOException, InterruptedException {
    Options options = Options.parse(args, USAGE);
    if (options.httpOnly) {
      System.err.println("--http-only is a fabric8 option: client-java watches over HTTP only");
      System.exit(2);
    }
    ApiClient client = Config.defaultClient();
    client.setHttpClient(client.getHttpClient().newBuilder().readTimeout(0, TimeUnit.SECONDS).build());
    String namespace = options.namespace != null ? options.namespace : "default";
    GenericKubernetesApi<V1ConfigMap, V1ConfigMapList> configMaps =
        new GenericKubernetesApi<>(
            V1ConfigMap.class, V1ConfigMapList.class, "", "v1", "configmaps", client);
    List<SharedIndexInformer<V1ConfigMap>> informers = new ArrayList<>();
    List<SharedInformerFactory> factories = new ArrayList<>();
    for (int i = 0; i < options.informers; i++) {
      SharedInformerFactory factory = new SharedInformerFactory(client);
      SharedIndexInformer<V1ConfigMap> informer =
          factory.sharedIndexInformerFor(configMaps, V1ConfigMap.class, 0, namespace);
      informer.addEventHandler(new Handler(i));
      informers.add(informer);
      factories.add(factory);
    }
    for (SharedInformerFactory factory : factories) {
      factory.startAllRegisteredInformers();
    }
    // client-java offers no wait for a sync: poll hasSynced (the informers' own threads work).
    for (SharedIndexInformer<V1ConfigMap> informer : informers) {
      while (!informer.hasSynced()) {
        Thread.sleep(SYNC_POLL_MILLIS);
      }
    }
    Lines.marker("READY");
    // The client's threads may all be daemons (fabric8's are): hold the program until
    // SIGTERM, which ends it as any JVM.
    new CountDownLatch(1).await();
  }

  private static final class Handler implements ResourceEventHandler<V1ConfigMap> {
    private final int informer;

    Handler(int informer) {
      this.informer = informer;
    }

    @Override
    public void onAdd(V1ConfigMap obj) {
      print("ADDED", obj, false);
    }

    @Override
    public void onUpdate(V1ConfigMap oldObj, V1ConfigMap newObj) {
      String type =
          Lines.updateType(
              oldObj.getMetadata().getResourceVersion(), newObj.getMetadata().getResourceVersion());
      print(type, newObj, false);
    }

    @Override
    public void onDelete(V1ConfigMap obj, boolean deletedFinalStateUnknown) {
      print("DELETED", obj, deletedFinalStateUnknown);
    }

    private void print(String type, V1ConfigMap obj, boolean tombstone) {
      V1ObjectMeta meta = obj.getMetadata();
      Lines.object(
          type,
          informer,
          meta.getNamespace(),
          meta.getName(),
          meta.getResourceVersion(),
          tombstone);
    }
  }
}
