package watchproxy.testclients;

import io.kubernetes.client.informer.ResourceEventHandler;
import io.kubernetes.client.informer.SharedIndexInformer;
import io.kubernetes.client.informer.SharedInformerFactory;
import io.kubernetes.client.common.KubernetesListObject;
import io.kubernetes.client.common.KubernetesObject;
import io.kubernetes.client.openapi.ApiClient;
import io.kubernetes.client.openapi.models.V1ConfigMap;
import io.kubernetes.client.openapi.models.V1ConfigMapList;
import io.kubernetes.client.openapi.models.V1ObjectMeta;
import io.kubernetes.client.openapi.models.V1Pod;
import io.kubernetes.client.openapi.models.V1PodList;
import io.kubernetes.client.util.Config;
import io.kubernetes.client.util.generic.GenericKubernetesApi;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * The official client-java's {@code SharedInformerFactory} informers on the configmaps (or, with
 * {@code --resource pods}, the pods) of one namespace, every handler call as one JSON line (see
 * {@link Lines}).
 *
 * <pre>
 *   java -jar client-java-informers.jar [--namespace NS] [--informers N] [--resource R]
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
      "java -jar client-java-informers.jar [--namespace NS] [--informers N]"
          + " [--resource configmaps|pods]";
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
    if (options.resource.equals("pods")) {
      run(
          new GenericKubernetesApi<>(V1Pod.class, V1PodList.class, "", "v1", "pods", client),
          V1Pod.class,
          client,
          namespace,
          options.informers);
    } else {
      run(
          new GenericKubernetesApi<>(
              V1ConfigMap.class, V1ConfigMapList.class, "", "v1", "configmaps", client),
          V1ConfigMap.class,
          client,
          namespace,
          options.informers);
    }
    Lines.marker("READY");
    // The client's threads may all be daemons (fabric8's are): hold the program until
    // SIGTERM, which ends it as any JVM.
    new CountDownLatch(1).await();
  }

  /** Starts {@code count} informers on {@code objects}, each from a factory of its own, and
   * returns once every one has synced. */
  private static <T extends KubernetesObject, L extends KubernetesListObject> void run(
      GenericKubernetesApi<T, L> objects,
      Class<T> type,
      ApiClient client,
      String namespace,
      int count)
      throws InterruptedException {
    List<SharedIndexInformer<T>> informers = new ArrayList<>();
    List<SharedInformerFactory> factories = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      SharedInformerFactory factory = new SharedInformerFactory(client);
      SharedIndexInformer<T> informer = factory.sharedIndexInformerFor(objects, type, 0, namespace);
      informer.addEventHandler(new Handler<T>(i));
      informers.add(informer);
      factories.add(factory);
    }
    for (SharedInformerFactory factory : factories) {
      factory.startAllRegisteredInformers();
    }
    // client-java offers no wait for a sync: poll hasSynced (the informers' own threads work).
    for (SharedIndexInformer<T> informer : informers) {
      while (!informer.hasSynced()) {
        Thread.sleep(SYNC_POLL_MILLIS);
      }
    }
  }

  private static final class Handler<T extends KubernetesObject>
      implements ResourceEventHandler<T> {
    private final int informer;

    Handler(int informer) {
      this.informer = informer;
    }

    @Override
    public void onAdd(T obj) {
      print("ADDED", obj, false);
    }

    @Override
    public void onUpdate(T oldObj, T newObj) {
      String type =
          Lines.updateType(
              oldObj.getMetadata().getResourceVersion(), newObj.getMetadata().getResourceVersion());
      print(type, newObj, false);
    }

    @Override
    public void onDelete(T obj, boolean deletedFinalStateUnknown) {
      print("DELETED", obj, deletedFinalStateUnknown);
    }

    private void print(String type, T obj, boolean tombstone) {
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
