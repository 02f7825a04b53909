/*
 * A Hadoop cluster for the `yarn` tests: one MiniDFSCluster (NameNode + DataNode) and one
 * MiniYARNCluster (ResourceManager + N NodeManagers) in this JVM, everything on 127.0.0.1.
 *
 * Compiled and started by tests/yarn/conftest.py with the jars of pom.xml (the same Hadoop as
 * the HDFS tests). Usage:
 *
 *     java -Dtest.build.data=BASE/data -cp CLASSPATH:CLASSES YarnMiniCluster BASE NODEMANAGERS
 *
 * Writes BASE/conf/{core,hdfs,yarn}-site.xml (a HADOOP_CONF_DIR for spark-submit) and then
 * BASE/details.json (addresses, NodeManager folders) as its last start-up step, so that the file's
 * existence means "ready". Runs until it gets SIGTERM, then stops the NodeManagers in parallel
 * (each kills its containers), the ResourceManager and HDFS, and exits.
 */

import java.io.File;
import java.io.FileOutputStream;
import java.io.OutputStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import com.google.inject.servlet.GuiceFilter;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.service.Service;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;
import org.apache.hadoop.yarn.server.nodemanager.webapp.WebServer;
import org.apache.hadoop.yarn.webapp.WebApp;
import org.eclipse.jetty.servlet.FilterHolder;

public final class YarnMiniCluster {
  private static final String LOOPBACK = "127.0.0.1";
  private static final long NODE_MANAGERS_TIMEOUT_MS = 120_000;

  private YarnMiniCluster() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 2) {
      System.err.println("usage: YarnMiniCluster BASE_DIR NODE_MANAGERS");
      System.exit(2);
    }
    File base = new File(args[0]).getAbsoluteFile();
    int nodeManagers = Integer.parseInt(args[1]);

    Configuration conf = new Configuration();
    // HDFS, as tests/hdfs/conftest.py starts it: loopback only, one replica, and clients
    // (WebHDFS redirects included) reach the DataNode at 127.0.0.1.
    conf.set("dfs.namenode.rpc-bind-host", LOOPBACK);
    conf.set("dfs.namenode.http-bind-host", LOOPBACK);
    conf.set("dfs.namenode.http-address", LOOPBACK + ":0");
    conf.set("dfs.datanode.hostname", LOOPBACK);
    conf.set("dfs.datanode.use.datanode.hostname", "true");
    conf.set("dfs.client.use.datanode.hostname", "true");
    conf.set("dfs.datanode.address", LOOPBACK + ":0");
    conf.set("dfs.datanode.http.address", LOOPBACK + ":0");
    conf.set("dfs.datanode.ipc.address", LOOPBACK + ":0");
    conf.set("dfs.webhdfs.enabled", "true");
    conf.set("dfs.permissions.enabled", "true");
    conf.set("dfs.replication", "1");
    conf.set("hadoop.tmp.dir", new File(base, "tmp").getPath());

    MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf, new File(base, "dfs"))
        .numDataNodes(1)
        .format(true)
        .build();
    dfs.waitActive();
    String defaultFs = "hdfs://" + LOOPBACK + ":" + dfs.getNameNodePort();
    String webHdfs = LOOPBACK + ":" + dfs.getNameNode().getHttpAddress().getPort();

    YarnConfiguration yarnConf = new YarnConfiguration(conf);
    yarnConf.set("fs.defaultFS", defaultFs);
    yarnConf.set("yarn.resourcemanager.hostname", LOOPBACK);
    yarnConf.set("yarn.resourcemanager.bind-host", LOOPBACK);
    yarnConf.set("yarn.nodemanager.bind-host", LOOPBACK);
    // No queue file ships with the jars: one queue with the whole cluster, and room for the
    // ApplicationMasters of two applications at once.
    yarnConf.set("yarn.scheduler.capacity.root.queues", "default");
    yarnConf.set("yarn.scheduler.capacity.root.default.capacity", "100");
    yarnConf.set("yarn.scheduler.capacity.root.default.maximum-capacity", "100");
    yarnConf.set("yarn.scheduler.capacity.root.default.user-limit-factor", "1");
    yarnConf.set("yarn.scheduler.capacity.root.default.state", "RUNNING");
    yarnConf.set("yarn.scheduler.capacity.root.default.acl_submit_applications", "*");
    yarnConf.set("yarn.scheduler.capacity.maximum-am-resource-percent", "0.5");
    yarnConf.set("yarn.scheduler.capacity.node-locality-delay", "-1");
    yarnConf.set("yarn.scheduler.minimum-allocation-mb", "128");
    // Each NodeManager holds one executor (2048 MB, see tests/yarn/conftest.py) next to an
    // ApplicationMaster (896 MB in client mode, 1408 MB with the driver in cluster mode),
    // but never two executors: the scheduler hands a heartbeating node every container that
    // fits, so with YARN's default 8 GB one node could take both, and the tests require that
    // both NodeManagers run an executor.
    yarnConf.set("yarn.nodemanager.resource.memory-mb", "3584");
    // The machine is shared: no disk-space verdicts and no memory policing of containers
    // (TensorFlow maps far more virtual memory than it uses).
    yarnConf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "100.0");
    yarnConf.set("yarn.nodemanager.disk-health-checker.min-free-space-per-disk-mb", "0");
    yarnConf.set("yarn.nodemanager.pmem-check-enabled", "false");
    yarnConf.set("yarn.nodemanager.vmem-check-enabled", "false");
    // Containers are killed at once when an application ends or the cluster stops.
    yarnConf.set("yarn.nodemanager.process-kill-wait.ms", "500");
    yarnConf.set("yarn.nodemanager.sleep-delay-before-sigkill.ms", "250");
    yarnConf.set("yarn.nodemanager.delete.debug-delay-sec", "0");
    // Containers inherit these from the NodeManager (JAVA_HOME is set by the launcher).
    yarnConf.set("yarn.nodemanager.env-whitelist",
        "JAVA_HOME,HADOOP_COMMON_HOME,HADOOP_HDFS_HOME,HADOOP_CONF_DIR,HADOOP_YARN_HOME,PATH,LANG,TZ");

    MiniYARNCluster yarn = new MiniYARNCluster("tensorspark", nodeManagers, 1, 1);
    yarn.init(yarnConf);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> stop(yarn, dfs, nodeManagers), "stop-cluster"));
    yarn.start();
    if (!yarn.waitForNodeManagersToConnect(NODE_MANAGERS_TIMEOUT_MS)) {
      throw new IllegalStateException(nodeManagers + " NodeManagers did not register within "
          + NODE_MANAGERS_TIMEOUT_MS / 1000 + " s");
    }
    pinGuicePipelines(yarn, nodeManagers);
    Configuration live = yarn.getConfig();
    long deadline = System.currentTimeMillis() + 30_000;
    while (live.get(YarnConfiguration.RM_ADDRESS).endsWith(":0")) {  // set once the RM listens
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException("the ResourceManager never reported its port");
      }
      Thread.sleep(100);
    }

    File confDir = new File(base, "conf");
    confDir.mkdirs();
    Map<String, String> core = new TreeMap<>();
    core.put("fs.defaultFS", defaultFs);
    core.put("hadoop.tmp.dir", conf.get("hadoop.tmp.dir"));
    writeSite(new File(confDir, "core-site.xml"), core);
    Map<String, String> hdfs = new TreeMap<>();
    hdfs.put("dfs.namenode.http-address", webHdfs);
    hdfs.put("dfs.client.use.datanode.hostname", "true");
    hdfs.put("dfs.replication", "1");
    writeSite(new File(confDir, "hdfs-site.xml"), hdfs);
    Map<String, String> site = new TreeMap<>();
    for (String key : new String[] {
        YarnConfiguration.RM_ADDRESS, YarnConfiguration.RM_SCHEDULER_ADDRESS,
        YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS, YarnConfiguration.RM_ADMIN_ADDRESS,
        YarnConfiguration.RM_WEBAPP_ADDRESS}) {
      site.put(key, live.get(key));
    }
    writeSite(new File(confDir, "yarn-site.xml"), site);

    StringBuilder json = new StringBuilder();
    json.append("{\n  \"hdfs_url\": \"").append(defaultFs).append("\",\n");
    json.append("  \"webhdfs_address\": \"").append(webHdfs).append("\",\n");
    json.append("  \"rm_address\": \"").append(live.get(YarnConfiguration.RM_ADDRESS)).append("\",\n");
    json.append("  \"rm_web_address\": \"").append(live.get(YarnConfiguration.RM_WEBAPP_ADDRESS)).append("\",\n");
    json.append("  \"node_managers\": [");
    for (int i = 0; i < nodeManagers; i++) {
      Configuration nm = yarn.getNodeManager(i).getConfig();
      json.append(i == 0 ? "\n" : ",\n");
      json.append("    {\"local_dirs\": \"").append(nm.get(YarnConfiguration.NM_LOCAL_DIRS))
          .append("\", \"log_dirs\": \"").append(nm.get(YarnConfiguration.NM_LOG_DIRS))
          .append("\", \"web_address\": \"").append(nm.get(YarnConfiguration.NM_WEBAPP_ADDRESS))
          .append("\"}");
    }
    json.append("\n  ]\n}\n");
    File details = new File(base, "details.json");
    File partial = new File(base, "details.json.tmp");
    Files.writeString(partial.toPath(), json.toString(), StandardCharsets.UTF_8);
    Files.move(partial.toPath(), details.toPath(), StandardCopyOption.ATOMIC_MOVE);
    System.out.println("YarnMiniCluster ready: " + details);
    System.out.flush();
    Thread.currentThread().join();  // until SIGTERM runs the shutdown hook
  }

  /**
   * Make every YARN web app in this JVM answer with its own routes.
   *
   * <p>Hadoop's WebApps.Builder (3.3 and 3.5 alike) adds Guice's GuiceFilter to Jetty by class
   * name, so Jetty's instance has no pipeline of its own and routes through GuiceFilter's static
   * one, which each new web app's injector replaces (Guice logs "Multiple Servlet injectors
   * detected"). With the ResourceManager and the NodeManagers in one JVM the last NodeManager's
   * wins: the ResourceManager's port serves /ws/v1/node/... and answers 404 to every
   * /ws/v1/cluster/... call. Hadoop 3.4+ serves the REST API through Jersey 2 outside Guice, so
   * only 3.3's (Spark 3.5's Hadoop) REST API is hit, but its HTML pages are on every version.
   * Each web app keeps the GuiceFilter its own injector made (WebApp.guiceFilter, bound to its
   * pipeline): Jetty's instance is given that pipeline, the one GuiceFilter uses before the
   * static one.
   */
  private static void pinGuicePipelines(MiniYARNCluster yarn, int nodeManagers) throws Exception {
    List<WebApp> apps = new ArrayList<>();
    ResourceManager rm = yarn.getResourceManager();
    Field rmWebApp = ResourceManager.class.getDeclaredField("webApp");
    rmWebApp.setAccessible(true);
    apps.add((WebApp) rmWebApp.get(rm));
    for (int i = 0; i < nodeManagers; i++) {
      for (Service service : yarn.getNodeManager(i).getServices()) {
        if (service instanceof WebServer) {
          Field nmWebApp = WebServer.class.getDeclaredField("webApp");
          nmWebApp.setAccessible(true);
          apps.add((WebApp) nmWebApp.get(service));
        }
      }
    }
    Field own = WebApp.class.getDeclaredField("guiceFilter");
    own.setAccessible(true);
    Field pipeline = GuiceFilter.class.getDeclaredField("injectedPipeline");
    pipeline.setAccessible(true);
    for (WebApp app : apps) {
      FilterHolder holder =
          app.httpServer().getWebAppContext().getServletHandler().getFilter("guice");
      Object injected = own.get(app);
      if (holder == null || injected == null) {
        throw new IllegalStateException("web app " + app.name() + " has no Guice filter to pin");
      }
      pipeline.set(holder.getFilter(), pipeline.get(injected));
    }
    System.out.println(
        "YarnMiniCluster: pinned the Guice pipelines of " + apps.size() + " web apps");
  }

  private static void writeSite(File file, Map<String, String> values) throws Exception {
    Configuration out = new Configuration(false);
    values.forEach(out::set);
    try (OutputStream stream = new FileOutputStream(file)) {
      out.writeXml(stream);
    }
  }

  /** NodeManagers one after another take over 30 s to stop: stop them in parallel. */
  private static void stop(MiniYARNCluster yarn, MiniDFSCluster dfs, int nodeManagers) {
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < nodeManagers; i++) {
      NodeManager nm = yarn.getNodeManager(i);
      if (nm == null) {
        continue;
      }
      Thread thread = new Thread(nm::stop, "stop-nm-" + i);
      thread.start();
      threads.add(thread);
    }
    for (Thread thread : threads) {
      try {
        thread.join(20_000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    try {
      yarn.stop();
    } finally {
      dfs.shutdown();
    }
  }
}
