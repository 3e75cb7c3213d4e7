# End-to-end on a real Slurm cluster with the real binaries: duet-bridge
# (slurm.enabled), duetctl, spank_duet.so in plugstack.conf, Slurm's CLI.
# Needs what the other "slurm" tests need (root, slurmctld, slurmd, munge,
# `unshare --uts`); each test starts and stops its own cluster.
add_executable(slurm_e2e_test ${CMAKE_CURRENT_LIST_DIR}/slurm_e2e_test.cc)
target_compile_options(slurm_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(slurm_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(slurm_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh")
target_link_libraries(slurm_e2e_test PRIVATE duet::proto duet::spank_core absl::strings absl::time
                      GTest::gtest_main)
add_dependencies(slurm_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(slurm_e2e_test DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS slurm TIMEOUT 420)

# The issue's scenario: a pod bound through the scheduler extender beside a
# running Slurm job (real duet-bridge with slurm.enabled, the extender and the
# pod watch against tests/fakes/fake_apiserver.py; the real Slurm cluster).
add_executable(pod_e2e_test ${CMAKE_CURRENT_LIST_DIR}/pod_e2e_test.cc
               ${PROJECT_SOURCE_DIR}/tests/k8s_adapter/fake_server.cc)
target_compile_options(pod_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(pod_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(pod_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh"
  DUET_K8S_TESTDATA="${PROJECT_SOURCE_DIR}/tests/k8s_adapter/testdata"
  DUET_FAKE_APISERVER="${PROJECT_SOURCE_DIR}/tests/fakes/fake_apiserver.py")
target_link_libraries(pod_e2e_test PRIVATE duet::proto duet::k8s absl::strings absl::time
                      nlohmann_json::nlohmann_json GTest::gtest_main)
add_dependencies(pod_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(pod_e2e_test DISCOVERY_TIMEOUT 60 TEST_PREFIX pod_e2e.
  PROPERTIES LABELS slurm TIMEOUT 120)

# duet-bridge as its pod runs it (a mount namespace with only what the chart
# mounts, tests/integration/pod_ns.sh): without its sackd/munged sidecar it
# says it cannot authenticate; with it, it creates its Slurm nodes.
add_executable(bridge_pod_auth_test ${CMAKE_CURRENT_LIST_DIR}/bridge_pod_auth_test.cc)
target_compile_options(bridge_pod_auth_test PRIVATE ${DUET_WARNINGS})
target_include_directories(bridge_pod_auth_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(bridge_pod_auth_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUET_POD_NS_SH="${PROJECT_SOURCE_DIR}/tests/integration/pod_ns.sh"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh")
target_link_libraries(bridge_pod_auth_test PRIVATE absl::strings absl::time GTest::gtest_main)
add_dependencies(bridge_pod_auth_test duet-bridge)
gtest_discover_tests(bridge_pod_auth_test DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS slurm TIMEOUT 300)

# The deployment's shape end to end (tests/integration/deployment_e2e_test.cc):
# slurmctld, two configless slurmds and duet-bridge (with its sackd/munged
# sidecar) each in a pod's mount namespace holding only what its pod mounts
# (slurm_cluster.sh init --isolated, pod_ns.sh); GPU steps register with the
# bridge over TCP; no pod sees another's files.
add_executable(deployment_e2e_test ${CMAKE_CURRENT_LIST_DIR}/deployment_e2e_test.cc)
target_compile_options(deployment_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(deployment_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(deployment_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_POD_NS_SH="${PROJECT_SOURCE_DIR}/tests/integration/pod_ns.sh"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh")
target_link_libraries(deployment_e2e_test PRIVATE duet::proto absl::strings absl::time
                      GTest::gtest_main)
add_dependencies(deployment_e2e_test duet-bridge spank_duet)
gtest_discover_tests(deployment_e2e_test DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS slurm TIMEOUT 180)

# The DRA lending mode end to end (issue 26): the real duet-bridge with
# dra.enabled and its admission webhook, the fake apiserver at 1.37 calling
# it, the fake NVIDIA driver's slices, the test scheduler as a process, and
# the real Slurm cluster.
add_executable(dra_e2e_test ${CMAKE_CURRENT_LIST_DIR}/dra_e2e_test.cc
               ${PROJECT_SOURCE_DIR}/tests/k8s_adapter/fake_server.cc)
target_compile_options(dra_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(dra_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(dra_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh"
  DUET_K8S_TESTDATA="${PROJECT_SOURCE_DIR}/tests/k8s_adapter/testdata"
  DUET_FAKE_APISERVER="${PROJECT_SOURCE_DIR}/tests/fakes/fake_apiserver.py"
  DUET_FAKES_DIR="${PROJECT_SOURCE_DIR}/tests/fakes")
target_link_libraries(dra_e2e_test PRIVATE duet::proto duet::k8s absl::strings absl::time
                      nlohmann_json::nlohmann_json GTest::gtest_main)
add_dependencies(dra_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(dra_e2e_test DISCOVERY_TIMEOUT 60 TEST_PREFIX dra_e2e.
  PROPERTIES LABELS slurm TIMEOUT 180)

# Gangs in the DRA lending mode end to end (issue 27, docs/dra.md "Gangs"):
# dra_e2e_test's world (dra_world.h) on two nodes with PodGroups served; one
# gang job over both nodes, the webhook's gang fence, a gang that cannot fit,
# a member deleted while gathering.
add_executable(dra_gang_e2e_test ${CMAKE_CURRENT_LIST_DIR}/dra_gang_e2e_test.cc
               ${PROJECT_SOURCE_DIR}/tests/k8s_adapter/fake_server.cc)
target_compile_options(dra_gang_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(dra_gang_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(dra_gang_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh"
  DUET_K8S_TESTDATA="${PROJECT_SOURCE_DIR}/tests/k8s_adapter/testdata"
  DUET_FAKE_APISERVER="${PROJECT_SOURCE_DIR}/tests/fakes/fake_apiserver.py"
  DUET_FAKES_DIR="${PROJECT_SOURCE_DIR}/tests/fakes")
target_link_libraries(dra_gang_e2e_test PRIVATE duet::proto duet::k8s absl::strings absl::time
                      nlohmann_json::nlohmann_json GTest::gtest_main)
add_dependencies(dra_gang_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(dra_gang_e2e_test DISCOVERY_TIMEOUT 60 TEST_PREFIX dra_gang_e2e.
  PROPERTIES LABELS slurm TIMEOUT 120)

# Gangs end to end (docs/gangs.md, issue 27): a PodGroup's members through
# the real duet-bridge's extender (the fake apiserver with --gang-crds), one
# Slurm job over both nodes of the real cluster; what cannot be placed holds
# nothing; a member deleted while gathering, a bridge killed and restarted,
# and a slurmctld restart.
add_executable(gang_e2e_test ${CMAKE_CURRENT_LIST_DIR}/gang_e2e_test.cc
               ${PROJECT_SOURCE_DIR}/tests/k8s_adapter/fake_server.cc)
target_compile_options(gang_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(gang_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(gang_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh"
  DUET_K8S_TESTDATA="${PROJECT_SOURCE_DIR}/tests/k8s_adapter/testdata"
  DUET_FAKE_APISERVER="${PROJECT_SOURCE_DIR}/tests/fakes/fake_apiserver.py")
target_link_libraries(gang_e2e_test PRIVATE duet::proto duet::k8s absl::strings absl::time
                      nlohmann_json::nlohmann_json GTest::gtest_main)
add_dependencies(gang_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(gang_e2e_test DISCOVERY_TIMEOUT 60 TEST_PREFIX gang_e2e.
  PROPERTIES LABELS slurm TIMEOUT 120)
# Multi-host TPU slices end to end (docs/gangs.md 5): a Slurm job takes one
# slice by feature (its step gets TPU_WORKER_ID/HOSTNAMES), a gang the other
# whole; nothing more gets either slice.
add_executable(tpu_slice_e2e_test ${CMAKE_CURRENT_LIST_DIR}/tpu_slice_e2e_test.cc
               ${PROJECT_SOURCE_DIR}/tests/k8s_adapter/fake_server.cc)
target_compile_options(tpu_slice_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(tpu_slice_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(tpu_slice_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUETCTL_BIN="$<TARGET_FILE:duetctl>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh"
  DUET_K8S_TESTDATA="${PROJECT_SOURCE_DIR}/tests/k8s_adapter/testdata"
  DUET_FAKE_APISERVER="${PROJECT_SOURCE_DIR}/tests/fakes/fake_apiserver.py")
target_link_libraries(tpu_slice_e2e_test PRIVATE duet::proto duet::k8s absl::strings absl::time
                      nlohmann_json::nlohmann_json GTest::gtest_main)
add_dependencies(tpu_slice_e2e_test duet-bridge duetctl spank_duet)
gtest_discover_tests(tpu_slice_e2e_test DISCOVERY_TIMEOUT 60 TEST_PREFIX tpu_slice_e2e.
  PROPERTIES LABELS slurm TIMEOUT 120)

# The agent path (issue 28): spank_duet.so's plugstack agent= in real
# slurmstepds, duet-node's step agent in its own mount namespace (pod_ns.sh)
# sharing only /run/duet with slurmd, the real duet-bridge checking each
# step's credential.
add_executable(step_agent_e2e_test ${CMAKE_CURRENT_LIST_DIR}/step_agent_e2e_test.cc)
target_compile_options(step_agent_e2e_test PRIVATE ${DUET_WARNINGS})
target_include_directories(step_agent_e2e_test PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(step_agent_e2e_test PRIVATE
  DUET_BRIDGE_BIN="$<TARGET_FILE:duet-bridge>"
  DUET_NODE_BIN="$<TARGET_FILE:duet-node>"
  DUET_SPANK_SO="$<TARGET_FILE:spank_duet>"
  DUET_POD_NS_SH="${PROJECT_SOURCE_DIR}/tests/integration/pod_ns.sh"
  DUET_SLURM_CLUSTER_SH="${PROJECT_SOURCE_DIR}/tests/integration/slurm_cluster.sh")
target_link_libraries(step_agent_e2e_test PRIVATE duet::proto absl::strings absl::time
                      GTest::gtest_main)
add_dependencies(step_agent_e2e_test duet-bridge duet-node spank_duet)
gtest_discover_tests(step_agent_e2e_test DISCOVERY_TIMEOUT 60
  PROPERTIES LABELS slurm TIMEOUT 300)
