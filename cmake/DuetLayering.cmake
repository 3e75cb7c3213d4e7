# duet_check_layering(): the dependency rules of bridge/README.md, checked at
# configure time over every target and over the #include lines of the folders
# the rules name. A broken rule stops the configure with FATAL_ERROR naming
# the edge ("layering: <target> (<layer>) links <dep> (<layer>)"), so no
# build ever has it. tests/layering checks that it does.
#
# Layers, by the folder a target or file is in (relative to PROJECT_SOURCE_DIR):
#   leaf           common/ and below: links only the leaf, proto and
#                  absl/gRPC/protobuf/OpenSSL/prometheus-cpp/threads
#   core           bridge/{ledger,placement,journal,inventory,config,api}:
#                  links only core, leaf and proto; includes no adapter
#   slurm_plugin   slurm_plugin/: links and includes only itself, the leaf
#                  and proto
#   kube           k8s_adapter/ itself and k8s_adapter/common/: the generic
#                  Kubernetes client (duet_kube, duet_k8s_common); links and
#                  includes only itself, the leaf and proto
#   device_plugin  k8s_adapter/device_plugin/: links and includes only itself,
#                  kube, the leaf and proto
#   proto          proto/
# Everything else (bridge/server, bridge/slurm, bridge/pods, the extender,
# k8s_adapter/reconcile, duetctl, tests, bench) is an adapter or a program:
# unchecked.

set(DUET_CORE_DIRS bridge/ledger bridge/placement bridge/journal bridge/inventory
    bridge/config bridge/api)

# The layer of a folder relative to PROJECT_SOURCE_DIR ("" when unchecked).
function(_duet_layer_of_dir rel out)
  set(layer "")
  if(rel STREQUAL "common" OR rel MATCHES "^common/")
    set(layer leaf)
  elseif(rel STREQUAL "proto" OR rel MATCHES "^proto/")
    set(layer proto)
  elseif(rel STREQUAL "slurm_plugin" OR rel MATCHES "^slurm_plugin/")
    set(layer slurm_plugin)
  elseif(rel STREQUAL "k8s_adapter/device_plugin" OR rel MATCHES "^k8s_adapter/device_plugin/")
    set(layer device_plugin)
  elseif(rel STREQUAL "k8s_adapter" OR rel STREQUAL "k8s_adapter/common")
    set(layer kube)
  else()
    foreach(core ${DUET_CORE_DIRS})
      if(rel STREQUAL core OR rel MATCHES "^${core}/")
        set(layer core)
      endif()
    endforeach()
  endif()
  set(${out} "${layer}" PARENT_SCOPE)
endfunction()

# Every target defined under `dir`, recursively.
function(_duet_all_targets dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    _duet_all_targets(${sub} sub_targets)
    list(APPEND targets ${sub_targets})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# The layer of target `t` ("" when unchecked or not ours); `rel` its folder.
function(_duet_target_layer t out_layer out_rel)
  set(layer "")
  set(rel "")
  get_target_property(imported ${t} IMPORTED)
  if(NOT imported)
    get_target_property(src ${t} SOURCE_DIR)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
    if(NOT rel MATCHES "^\\.\\.")
      _duet_layer_of_dir("${rel}" layer)
    endif()
  endif()
  set(${out_layer} "${layer}" PARENT_SCOPE)
  set(${out_rel} "${rel}" PARENT_SCOPE)
endfunction()

# Whether a dependency in `dep_layer` (or the target `dep`) may be linked
# from `layer`.
function(_duet_link_allowed layer dep dep_layer out)
  set(ok FALSE)
  if(layer STREQUAL "leaf")
    if(dep_layer MATCHES "^(leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "core")
    if(dep_layer MATCHES "^(core|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "slurm_plugin")
    if(dep_layer MATCHES "^(slurm_plugin|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "kube")
    if(dep_layer MATCHES "^(kube|leaf|proto)$")
      set(ok TRUE)
    endif()
  elseif(layer STREQUAL "device_plugin")
    if(dep_layer MATCHES "^(device_plugin|kube|leaf|proto)$")
      set(ok TRUE)
    endif()
  else()
    set(ok TRUE)
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

# Whether a quoted #include of `path` may appear in a file of `layer`.
function(_duet_include_allowed layer path out)
  set(ok TRUE)
  # Only paths into duet's own folders are judged; absl/, grpcpp/, the
  # generated duet/v1/ etc. are libraries or proto.
  if(path MATCHES "^(bridge|k8s_adapter|slurm_plugin|duetctl|bench|tests)/")
    set(ok FALSE)
    if(layer STREQUAL "core")
      foreach(core ${DUET_CORE_DIRS})
        if(path MATCHES "^${core}/")
          set(ok TRUE)
        endif()
      endforeach()
    elseif(layer STREQUAL "slurm_plugin")
      if(path MATCHES "^slurm_plugin/")
        set(ok TRUE)
      endif()
    elseif(layer STREQUAL "kube")
      if(path MATCHES "^k8s_adapter/(common/|[^/]+$)")
        set(ok TRUE)
      endif()
    elseif(layer STREQUAL "device_plugin")
      if(path MATCHES "^k8s_adapter/(device_plugin/|common/|[^/]+$)")
        set(ok TRUE)
      endif()
    endif()
  endif()
  set(${out} ${ok} PARENT_SCOPE)
endfunction()

function(duet_check_layering)
  set(errors "")
  set(leaf_external "^(absl::|gRPC::|protobuf::|OpenSSL::|prometheus-cpp::|Threads::Threads$)")
  _duet_all_targets(${PROJECT_SOURCE_DIR} targets)
  foreach(t ${targets})
    _duet_target_layer(${t} layer rel)
    if(layer STREQUAL "")
      continue()
    endif()
    get_target_property(type ${t} TYPE)
    set(deps "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND deps ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND deps ${iface})
    endif()
    list(REMOVE_DUPLICATES deps)
    foreach(dep ${deps})
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
      if(dep MATCHES "^\\$<" OR dep MATCHES "^-")
        continue()  # other generator expressions, linker flags
      endif()
      set(dep_name "${dep}")
      set(dep_layer "")
      set(ours FALSE)
      if(TARGET ${dep})
        get_target_property(aliased ${dep} ALIASED_TARGET)
        if(aliased)
          set(dep_name ${aliased})
        endif()
        _duet_target_layer(${dep_name} dep_layer dep_rel)
        get_target_property(dep_imported ${dep_name} IMPORTED)
        if(NOT dep_imported AND NOT dep_rel MATCHES "^\\.\\.")
          set(ours TRUE)
        endif()
      endif()
      if(ours)
        _duet_link_allowed(${layer} ${dep_name} "${dep_layer}" ok)
        if(NOT ok)
          if(dep_layer STREQUAL "")
            set(dep_layer "adapter")
          endif()
          list(APPEND errors
               "layering: ${t} (${layer}, ${rel}) links ${dep_name} (${dep_layer}, ${dep_rel})")
        endif()
      elseif(layer STREQUAL "leaf" AND NOT dep MATCHES "${leaf_external}")
        list(APPEND errors
             "layering: ${t} (leaf, ${rel}) links ${dep}, which the leaf may not use (only absl, gRPC, protobuf, OpenSSL, prometheus-cpp, threads)")
      endif()
    endforeach()
  endforeach()

  # #include lines of the checked folders.
  file(GLOB_RECURSE sources RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/common/*.h ${PROJECT_SOURCE_DIR}/common/*.cc
       ${PROJECT_SOURCE_DIR}/slurm_plugin/*.h ${PROJECT_SOURCE_DIR}/slurm_plugin/*.c
       ${PROJECT_SOURCE_DIR}/slurm_plugin/*.cc
       ${PROJECT_SOURCE_DIR}/k8s_adapter/device_plugin/*.h
       ${PROJECT_SOURCE_DIR}/k8s_adapter/device_plugin/*.cc
       ${PROJECT_SOURCE_DIR}/k8s_adapter/common/*.h ${PROJECT_SOURCE_DIR}/k8s_adapter/common/*.cc)
  file(GLOB kube_sources RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/k8s_adapter/*.h ${PROJECT_SOURCE_DIR}/k8s_adapter/*.cc)
  list(APPEND sources ${kube_sources})
  foreach(core ${DUET_CORE_DIRS})
    file(GLOB_RECURSE core_sources RELATIVE ${PROJECT_SOURCE_DIR}
         ${PROJECT_SOURCE_DIR}/${core}/*.h ${PROJECT_SOURCE_DIR}/${core}/*.cc)
    list(APPEND sources ${core_sources})
  endforeach()
  foreach(f ${sources})
    get_filename_component(dir ${f} DIRECTORY)
    _duet_layer_of_dir("${dir}" layer)
    if(layer STREQUAL "leaf")
      set(layer leaf_includes)
    endif()
    file(STRINGS ${PROJECT_SOURCE_DIR}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line ${lines})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" path "${line}")
      if(layer STREQUAL "leaf_includes")
        # The leaf includes nothing of duet's but itself and proto/.
        if(path MATCHES "^(bridge|k8s_adapter|slurm_plugin|duetctl|bench|tests)/")
          list(APPEND errors "layering: ${f} (leaf) includes ${path}")
        endif()
      else()
        _duet_include_allowed(${layer} "${path}" ok)
        if(NOT ok)
          list(APPEND errors "layering: ${f} (${layer}) includes ${path}")
        endif()
      endif()
    endforeach()
  endforeach()

  if(errors)
    list(JOIN errors "\n  " text)
    message(FATAL_ERROR "duet's dependency rules (bridge/README.md) are broken:\n  ${text}\n"
                        "Move the shared code into common/, or depend on an interface the "
                        "core owns.")
  endif()
  message(STATUS "layering: the leaf, core, kube, slurm_plugin and device_plugin rules hold")
endfunction()
