package watchproxy.testclients;

import io.fabric8.kubernetes.api.model.HasMetadata;
import io.fabric8.kubernetes.client.Config;
import io.fabric8.kubernetes.client.ConfigBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.dsl.Informable;
import io.fabric8.kubernetes.client.informers.ResourceEventHandler;
import io.fabric8.kubernetes.client.informers.SharedIndexInformer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CompletableFuture;

/**
 * fabric8 kubernetes-client informers on the configmaps (or, with {@code --resource pods}, the
 * pods) of one namespace, every handler call as one JSON line (see {@link Lines}).
 *
 * <pre>
 *   java -jar fabric8-informers.jar [--namespace NS] [--informers N] [--resource R] [--http-only]
 * </pre>
 *
 * The client is built from the default {@code Config} (autoconfigured from KUBECONFIG), with
 * its default HTTP client and WebSocket watches; {@code --http-only} sets {@code onlyHttpWatches}
 * and changes nothing else. Each of the N informers is a {@code runnableInformer} of its own:
 * its own LIST and its own watch, as N independent components of one application would have.
 * READY is printed once every informer has synced; an informer that stops for good (fabric8
 * gives up when its first watch is refused) prints ERROR and ends the program with status 1.
 */
public final class Fabric8Informers {
  private static final String USAGE =
      "java -jar fabric8-informers.jar [--namespace NS] [--informers N]"
          + " [--resource configmaps|pods] [--http-only]";

  private Fabric8Informers() {}

  public static void main(String[] args) throws InterruptedException {
    Options options = Options.parse(args, USAGE);
    Config config = Config.autoConfigure(null);
    if (options.httpOnly) {
      config = new ConfigBuilder(config).withOnlyHttpWatches(true).build();
    }
    KubernetesClient client = new KubernetesClientBuilder().withConfig(config).build();
    String namespace = options.namespace != null ? options.namespace : client.getNamespace();
    List<CompletableFuture<Void>> started = new ArrayList<>();
    for (int i = 0; i < options.informers; i++) {
      Informable<? extends HasMetadata> objects =
          options.resource.equals("pods")
              ? client.pods().inNamespace(namespace)
              : client.configMaps().inNamespace(namespace);
      started.add(start(objects, i));
    }
    try {
      CompletableFuture.allOf(started.toArray(new CompletableFuture[0])).join();
    } catch (RuntimeException error) {
      Lines.error("ERROR", -1, error);
      Runtime.getRuntime().halt(1);
    }
    Lines.marker("READY");
    // The client's threads may all be daemons (fabric8's are): hold the program until
    // SIGTERM, which ends it as any JVM.
    new CountDownLatch(1).await();
  }

  /** Starts one informer on {@code objects} whose handler prints as informer {@code informer}. */
  private static <T extends HasMetadata> CompletableFuture<Void> start(
      Informable<T> objects, int informer) {
    SharedIndexInformer<T> shared = objects.runnableInformer(0);
    shared.addEventHandler(new Handler<T>(informer));
    shared
        .stopped()
        .whenComplete(
            (ignored, error) -> {
              if (error != null) {
                Lines.error("ERROR", informer, error);
                Runtime.getRuntime().halt(1);
              }
            });
    return shared.start().toCompletableFuture();
  }

  private static final class Handler<T extends HasMetadata> implements ResourceEventHandler<T> {
    private final int informer;

    Handler(int informer) {
      this.informer = informer;
    }

    @Override
    public void onAdd(T obj) {
      print("ADDED", obj);
    }

    @Override
    public void onUpdate(T oldObj, T newObj) {
      String type =
          Lines.updateType(
              oldObj.getMetadata().getResourceVersion(), newObj.getMetadata().getResourceVersion());
      print(type, newObj);
    }

    @Override
    public void onDelete(T obj, boolean deletedFinalStateUnknown) {
      var meta = obj.getMetadata();
      Lines.object(
          "DELETED",
          informer,
          meta.getNamespace(),
          meta.getName(),
          meta.getResourceVersion(),
          deletedFinalStateUnknown);
    }

    private void print(String type, T obj) {
      var meta = obj.getMetadata();
      Lines.object(type, informer, meta.getNamespace(), meta.getName(), meta.getResourceVersion());
    }
  }
}
